#include "common/command_line.hpp"

#include <algorithm>
#include <sstream>

#include "common/errors.hpp"

namespace ddprun::command_line {

std::string canonical(std::string_view spelled) {
  std::string name(spelled);
  if (name.rfind("--", 0) == 0) std::replace(name.begin() + 2, name.end(), '-', '_');
  return name;
}

std::optional<FlagShape> StandardFlags::shape(const std::string& name) {
  if (name == "--help") return FlagShape{Takes::InlineValue, "help"};  // --help=markdown
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

void print_option(std::ostream& out, const std::string& names, const std::string& help, const std::string& default_text,
                  size_t width) {
  constexpr size_t kColumn = 25;  // where the help starts
  std::vector<std::string> words;
  std::istringstream in(plain(help));
  for (std::string w; in >> w;) words.push_back(w);
  if (!default_text.empty()) words.push_back("(default: " + plain(default_text) + ")");  // never broken
  std::string line = "  " + names;
  if (line.size() + 2 > kColumn) {
    out << line << "\n";
    line.clear();
  }
  line.resize(kColumn, ' ');
  bool first_on_line = true;
  for (const std::string& word : words) {
    if (!first_on_line && line.size() + 1 + word.size() > width) {
      out << line << "\n";
      line.assign(kColumn, ' ');
      first_on_line = true;
    }
    if (!first_on_line) line += ' ';
    line += word;
    first_on_line = false;
  }
  out << line << "\n";
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
