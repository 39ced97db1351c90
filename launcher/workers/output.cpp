#include "launcher/workers/output.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.hpp"
#include "common/system.hpp"

namespace ddprun::launcher::workers {

std::string expand_prefix(std::string tmpl, int rank, int local_rank, const std::string& role,
                          const std::string& host) {
  return expand_prefix_text(std::move(tmpl), std::to_string(rank), std::to_string(local_rank), role, host);
}

std::string expand_prefix_text(std::string tmpl, const std::string& rank, const std::string& local_rank,
                               const std::string& role, const std::string& host) {
  const std::pair<std::string, std::string> macros[] = {{"${rank}", rank},
                                                        {"${local_rank}", local_rank},
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
      file_fd_(std::move(sinks.file_fd)),
      file_name_(std::move(sinks.file_name)),
      filtered_(std::move(sinks.filtered)),
      merger_(std::move(sinks.merger)),
      rank_(sinks.rank),
      local_rank_(sinks.local_rank),
      tail_lines_(tail_lines) {}

LineWriter::~LineWriter() = default;

FilteredCopy::FilteredCopy(std::vector<std::string> filters, std::string path)
    : filters_(std::move(filters)), path_(std::move(path)) {
  fd_.reset(::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!fd_) log::warn("ddprun") << "cannot create " << path_ << ": " << std::strerror(errno) << "; no filtered copy";
}

FilteredCopy::~FilteredCopy() = default;

bool FilteredCopy::matches(std::string_view line) const {
  if (!fd_) return false;
  for (const std::string& f : filters_) {
    if (line.find(f) != std::string_view::npos) return true;
  }
  return false;
}

void FilteredCopy::write(std::string_view lines) {
  if (!fd_ || lines.empty()) return;
  if (!write_all(fd_.get(), lines)) {
    log::warn("ddprun") << "cannot write " << path_ << ": " << std::strerror(errno) << "; the filtered copy stops here";
    fd_.reset();
  }
}

void LineWriter::emit_line(std::string_view line, std::string& batch, std::string& filtered) {
  if (filtered_ && filtered_->matches(line)) {
    filtered += prefix_;
    filtered.append(line);
    filtered.push_back('\n');
  }
  if (merger_ && to_console_) {
    merger_->add(rank_, local_rank_, line);
  } else if (console_ && to_console_) {
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
  if (file_fd_ && !write_all(file_fd_.get(), data)) {
    // A full disk, say: the file stops here, says so once, and nothing is lost: the console gets
    // the output from here on.
    const int err = errno;
    log::warn("ddprun") << "cannot write " << file_name_ << ": " << std::strerror(err)
                        << (!console_     ? "; the rest of this output is dropped"
                            : to_console_ ? "; the rest goes to the console only"
                                          : "; the rest goes to the console instead");
    file_fd_.reset();
    to_console_ = true;
  }
  std::string batch, filtered;
  while (!data.empty()) {
    const size_t nl = data.find('\n');
    if (nl == std::string_view::npos) {
      partial_.append(data);
      data = {};
      while (partial_.size() >= kMaxLine) {
        emit_line(std::string_view(partial_).substr(0, kMaxLine), batch, filtered);
        partial_.erase(0, kMaxLine);
      }
      break;
    }
    if (partial_.empty()) {
      emit_line(data.substr(0, nl), batch, filtered);
    } else {
      partial_.append(data.substr(0, nl));
      emit_line(partial_, batch, filtered);
      partial_.clear();
    }
    data.remove_prefix(nl + 1);
  }
  write_console(batch);
  if (filtered_) filtered_->write(filtered);
}

void LineWriter::finish() {
  if (partial_.empty()) return;
  std::string batch, filtered;
  emit_line(partial_, batch, filtered);
  partial_.clear();
  write_console(batch);
  if (filtered_) filtered_->write(filtered);
}

}  // namespace ddprun::launcher::workers
