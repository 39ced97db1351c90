#include "common/command_line.hpp"

#include <sys/ioctl.h>

#include <algorithm>
#include <sstream>

#include "common/errors.hpp"
#include "common/numbers.hpp"

namespace ddprun::command_line {

std::string canonical(std::string_view spelled) {
  std::string name(spelled);
  if (name.rfind("--", 0) == 0) std::replace(name.begin() + 2, name.end(), '-', '_');
  return name;
}

std::optional<FlagShape> StandardFlags::shape(const std::string& name) {
  if (name == "--help") return FlagShape{Takes::InlineValue, "help", ""};  // --help=markdown
  if (name == "-h" || name == "--version") return FlagShape{};
  return std::nullopt;
}

bool StandardFlags::take(const std::string& name, const std::optional<std::string>& value) {
  if (name == "-h" || name == "--help") {
    if (value && *value != "markdown") {
      throw ConfigError(name + ": expected no value, or 'markdown' (the flag table of the docs), got '" + *value + "'");
    }
    help = true;
    markdown = value.has_value();
    return true;
  }
  if (name == "--version") {
    version = true;
    return true;
  }
  return false;
}

size_t walk(const std::vector<std::string>& args, size_t first, const FlagLookup& lookup,
            const std::function<bool(const std::string& name, const std::optional<std::string>& value)>& on_flag,
            const std::string& unknown_hint) {
  size_t i = first;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") return i + 1;
    if (a.empty() || a[0] != '-' || a == "-") break;
    std::string name = a;
    std::optional<std::string> value;
    if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
      name = a.substr(0, a.find('='));
      value = a.substr(a.find('=') + 1);
    } else if (a.size() > 2 && a[1] != '-') {
      // "-r3": a one-letter flag with its value attached.
      if (const auto shape = lookup(a.substr(0, 2)); shape && shape->takes == Takes::Value) {
        name = a.substr(0, 2);
        value = a.substr(2);
      }
    }
    const std::optional<FlagShape> shape = lookup(name);
    if (!shape) throw ConfigError("unknown option '" + name + "'" + unknown_hint);
    if (!shape->name.empty()) name = shape->name;
    if (shape->takes == Takes::Value && !value) {
      if (i + 1 >= args.size()) {
        throw ConfigError(name + " needs a value" + (shape->what.empty() ? "" : " (" + shape->what + ")"));
      }
      value = args[++i];
    } else if (shape->takes == Takes::Nothing && value) {
      throw ConfigError(name + " takes no value, got '" + *value + "'");
    }
    if (!on_flag(name, value)) return i;
  }
  return i;
}

std::vector<std::string> names_starting_with(std::string_view spelled, const std::vector<std::string>& names) {
  const std::string prefix = canonical(spelled);
  std::vector<std::string> out;
  if (prefix.size() <= 2 || prefix.rfind("--", 0) != 0) return out;
  for (const std::string& n : names) {
    if (n.rfind(prefix, 0) == 0) out.push_back(n);
  }
  return out;
}

size_t help_width(int fd, const std::function<std::optional<std::string>(const std::string&)>& env) {
  long long columns = 0;
  if (const auto v = env("COLUMNS")) {
    // As Python's int(): blanks around the number are fine.
    const auto b = v->find_first_not_of(" \t"), e = v->find_last_not_of(" \t");
    if (b != std::string::npos) columns = to_int(std::string_view(*v).substr(b, e - b + 1)).value_or(0);
  }
  if (columns <= 0) {
    winsize ws{};
    columns = ::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 80;
  }
  return static_cast<size_t>(std::max(columns, 3LL) - 2);
}

namespace {

// `words` as lines of at most `width` columns, a word longer than that cut into pieces that fit (as
// Python's textwrap cuts it).
std::vector<std::string> fill(const std::vector<std::string>& words, size_t width) {
  std::vector<std::string> lines;
  std::string line;
  auto add = [&](const std::string& word) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      lines.push_back(std::move(line));
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  };
  for (const std::string& word : words) {
    for (size_t at = 0; at < word.size(); at += width) add(word.substr(at, width));
  }
  if (!line.empty()) lines.push_back(std::move(line));
  return lines;
}

std::vector<std::string> words_of(std::string_view text) {
  std::vector<std::string> words;
  std::istringstream in{std::string(text)};
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

}  // namespace

void print_option(std::ostream& out, const std::string& names, const std::string& help, const std::string& default_text,
                  size_t width) {
  // argparse's HelpFormatter: the help at column min(24, width - 20), at least 11 columns of it.
  const size_t column = std::min<size_t>(24, std::max<size_t>(width > 20 ? width - 20 : 0, 4));
  const size_t help_columns = std::max<size_t>(width > column ? width - column : 0, 11);
  std::vector<std::string> words = words_of(plain(help));
  if (!default_text.empty()) {
    const std::string shown = "(default: " + plain(default_text) + ")";
    if (shown.size() <= help_columns) {
      words.push_back(shown);  // whole, where it fits on a line
    } else {
      for (auto& w : words_of(shown)) words.push_back(std::move(w));
    }
  }
  std::string line = "  " + names;
  if (words.empty()) {
    out << line << "\n";
    return;
  }
  if (line.size() + 2 > column) {
    out << line << "\n";
    line.clear();
  }
  for (const std::string& text : fill(words, help_columns)) {
    line.resize(column, ' ');
    out << line << text << "\n";
    line.clear();
  }
}

std::string wrap(std::string_view text, size_t width, size_t indent) {
  std::string out;
  const size_t columns = std::max<size_t>(width > indent ? width - indent : 0, 11);
  for (size_t at = 0; at <= text.size();) {
    size_t end = text.find("\n\n", at);
    if (end == std::string_view::npos) end = text.size();
    if (!out.empty()) out += "\n";
    for (const std::string& line : fill(words_of(text.substr(at, end - at)), columns)) {
      out += std::string(indent, ' ') + line + "\n";
    }
    at = end + 2;
  }
  return out;
}

std::string plain(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c != '`') out.push_back(c);
  }
  return out;
}

std::string markdown_row(const std::vector<std::string>& cells) {
  std::string row = "|";
  for (const std::string& cell : cells) {
    row += ' ';
    for (char c : cell) {
      if (c == '|') row += '\\';
      row += c;
    }
    row += " |";
  }
  return row;
}

std::string markdown_default(const std::string& shown) {
  if (shown.empty()) return shown;
  const auto words = shown.find(" (");
  if (words == std::string::npos) return "`" + shown + "`";
  return "`" + shown.substr(0, words) + "`" + shown.substr(words);
}

}  // namespace ddprun::command_line
