#include "launcher/workers/output.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.hpp"
#include "common/system.hpp"
#include "launcher/workers/output_file.hpp"

namespace ddprun::launcher::workers {

std::string expand_prefix(const std::string& tmpl, int rank, int local_rank, const std::string& role,
                          const std::string& host) {
  return expand_prefix_text(tmpl, std::to_string(rank), std::to_string(local_rank), role, host);
}

std::string expand_prefix_text(const std::string& tmpl, const std::string& rank, const std::string& local_rank,
                               const std::string& role, const std::string& host) {
  // Python's string.Template.safe_substitute, as torchrun 2.x expands TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE:
  // $name and ${name} are replaced, $$ is a $, and anything else (an unknown name, a $ alone) stays.
  auto value_of = [&](std::string_view name) -> const std::string* {
    if (name == "rank") return &rank;
    if (name == "local_rank") return &local_rank;
    if (name == "role_name") return &role;
    if (name == "host" || name == "hostname") return &host;
    return nullptr;
  };
  auto id_char = [](char c, bool first) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9');
  };
  std::string out;
  const size_t n = tmpl.size();
  for (size_t i = 0; i < n;) {
    if (tmpl[i] != '$') {
      out += tmpl[i++];
      continue;
    }
    if (i + 1 < n && tmpl[i + 1] == '$') {
      out += '$';
      i += 2;
      continue;
    }
    const bool braced = i + 1 < n && tmpl[i + 1] == '{';
    const size_t start = i + (braced ? 2 : 1);
    size_t j = start;
    while (j < n && id_char(tmpl[j], j == start)) ++j;
    if (j == start || (braced && (j >= n || tmpl[j] != '}'))) {
      out += tmpl[i++];
      continue;
    }
    const size_t after = braced ? j + 1 : j;
    const std::string* value = value_of(std::string_view(tmpl).substr(start, j - start));
    out += value ? *value : tmpl.substr(i, after - i);
    i = after;
  }
  return out;
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
  OpenedOutput file = open_output(path_, OutputRules{true, true});  // in ddprun's directory: a regular file
  fd_ = std::move(file.fd);
  if (!fd_) log::warn("ddprun") << "cannot write " << path_ << ": " << file.error << "; no filtered copy";
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
