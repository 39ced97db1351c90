#include "launcher/workers/output.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.hpp"
#include "common/system.hpp"

namespace ddprun::launcher::workers {

std::string expand_prefix(std::string tmpl, int rank, int local_rank, const std::string& role,
                          const std::string& host) {
  const std::pair<std::string, std::string> macros[] = {{"${rank}", std::to_string(rank)},
                                                        {"${local_rank}", std::to_string(local_rank)},
                                                        {"${role_name}", role},
                                                        {"${host}", host},
                                                        {"${hostname}", host}};  // torchrun 2.x's spelling
  for (const auto& [macro, value] : macros) {
    for (size_t pos = tmpl.find(macro); pos != std::string::npos; pos = tmpl.find(macro, pos + value.size())) {
      tmpl.replace(pos, macro.size(), value);
    }
  }
  return tmpl;
}

LineWriter::LineWriter(std::string prefix, Sinks sinks, size_t tail_lines)
    : prefix_(std::move(prefix)),
      console_(sinks.console),
      to_console_(sinks.to_console),
      file_fd_(sinks.file_fd),
      file_name_(std::move(sinks.file_name)),
      tail_lines_(tail_lines) {}

LineWriter::~LineWriter() {
  if (file_fd_ >= 0) ::close(file_fd_);
}

void LineWriter::emit_line(std::string_view line, std::string& batch) {
  if (console_ && to_console_) {
    batch += prefix_;
    batch.append(line);
    batch.push_back('\n');
  }
  if (tail_lines_ > 0) {
    tail_.emplace_back(line.substr(0, 512));
    if (tail_.size() > tail_lines_) tail_.pop_front();
  }
}

void LineWriter::write_console(const std::string& batch) {
  if (console_ && to_console_ && !batch.empty()) console_->write(batch);
}

void LineWriter::feed(std::string_view data) {
  if (file_fd_ >= 0 && !write_all(file_fd_, data)) {
    // A full disk, say: the file stops here, says so once, and nothing is lost: the console gets
    // the output from here on.
    const int err = errno;
    log::warn("ddprun") << "cannot write " << file_name_ << ": " << std::strerror(err)
                        << (!console_      ? "; the rest of this output is dropped"
                            : to_console_ ? "; the rest goes to the console only"
                                          : "; the rest goes to the console instead");
    ::close(file_fd_);
    file_fd_ = -1;
    to_console_ = true;
  }
  std::string batch;
  while (!data.empty()) {
    const size_t nl = data.find('\n');
    if (nl == std::string_view::npos) {
      partial_.append(data);
      data = {};
      while (partial_.size() >= kMaxLine) {
        emit_line(std::string_view(partial_).substr(0, kMaxLine), batch);
        partial_.erase(0, kMaxLine);
      }
      break;
    }
    if (partial_.empty()) {
      emit_line(data.substr(0, nl), batch);
    } else {
      partial_.append(data.substr(0, nl));
      emit_line(partial_, batch);
      partial_.clear();
    }
    data.remove_prefix(nl + 1);
  }
  write_console(batch);
}

void LineWriter::finish() {
  if (partial_.empty()) return;
  std::string batch;
  emit_line(partial_, batch);
  partial_.clear();
  write_console(batch);
}

}  // namespace ddprun::launcher::workers
