#pragma once
// Command lines, the one way ddprun's programs read them (ddprun, ddprun-rendezvous and its
// subcommands): how an argument list splits into flags and values, which spellings name one flag,
// and how an option is shown in --help. What each flag means stays with its program's flag table.
//
// Accepted: "--name value", "--name=value", a one-letter flag with its value attached ("-r3"), a
// switch alone ("--insecure"); dashes and underscores after the leading "--" are interchangeable.
// A lookup may also take a unique prefix of a name ("--nproc" for "--nproc_per_node"), as argparse does.
// The walk stops at "--" (taken) or at the first argument that is not a flag (a program and its
// arguments, or a subcommand's operand).

#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::command_line {

// What a flag takes.
enum class Takes {
  Nothing,      // a switch: "--insecure"
  Value,        // "--port 29400", "--port=29400"
  InlineValue,  // a switch that may also take a value inline: "--local_rank_arg", "--local_rank_arg=dash"
};

// What the walk needs to know of a flag: what it takes, and a line on what it is (for "needs a
// value" errors). nullopt from the lookup: no such flag.
struct FlagShape {
  Takes takes = Takes::Nothing;
  std::string what;
  // The flag's full name when the lookup took an abbreviation of it; "" when the name was exact.
  std::string name;
};
using FlagLookup = std::function<std::optional<FlagShape>(const std::string& name)>;

// "--max-key-bytes" -> "--max_key_bytes": the spelling flag tables compare. Other text unchanged.
std::string canonical(std::string_view spelled);

// Walks args[first..] and calls on_flag(name as given, value) for each flag in order (value:
// nullopt for a switch given alone; the full name when the lookup took an abbreviation); on_flag returns false to end the walk there (--help). Throws ConfigError for an unknown flag ("unknown option
// 'NAME'" + unknown_hint), a missing value ("NAME needs a value (WHAT)") or a value given to a
// switch ("NAME takes no value, got 'V'"). Returns the index of the first argument not taken
// (args.size() when all were; the flag's own index when on_flag ended the walk).
size_t walk(const std::vector<std::string>& args, size_t first, const FlagLookup& lookup,
            const std::function<bool(const std::string& name, const std::optional<std::string>& value)>& on_flag,
            const std::string& unknown_hint = "");

// The flags every program takes besides its own table's: -h, --help[=markdown], --version.
struct StandardFlags {
  bool help = false;
  bool markdown = false;  // --help=markdown: the flag table of the docs
  bool version = false;
  // Their shapes, for a lookup to try before its table; nullopt for any other name.
  static std::optional<FlagShape> shape(const std::string& name);
  // Takes one of them (true), or returns false for any other name. Throws ConfigError for a --help
  // value other than "markdown".
  bool take(const std::string& name, const std::optional<std::string>& value);
  // Whether the walk goes on after the flags taken so far (not after --help or --version).
  bool go_on() const { return !help && !version; }
};

// argparse's abbreviations: of `names` (canonical spellings, see canonical()), the ones `spelled`
// is a prefix of, after canonical(); `spelled` needs a character after the leading "--".
std::vector<std::string> names_starting_with(std::string_view spelled, const std::vector<std::string>& names);

// The width --help is wrapped to, as argparse's: COLUMNS when it is a positive number, else the
// width of the terminal on `fd`, else 80; less 2.
size_t help_width(int fd, const std::function<std::optional<std::string>(const std::string&)>& env);

// One option of a --help text, laid out as argparse lays it out: "  NAMES  HELP (default: DEFAULT)",
// the help from column min(24, width - 20) (on the next line when the names do not fit before it)
// and wrapped to `width` columns, as plain text (see plain()). An option's line is indented 2 columns,
// its help's lines more than 10: help2man and the completion script tell them apart so.
void print_option(std::ostream& out, const std::string& names, const std::string& help,
                  const std::string& default_text = "", size_t width = 100);
// `text` wrapped to `width` columns, each line indented by `indent` spaces; a blank line between
// paragraphs ("\n\n") is kept.
std::string wrap(std::string_view text, size_t width, size_t indent = 0);

// Flag tables write names and values in a help text in backticks, for the docs' Markdown; --help
// prints them plain: "`--tee` or `-t`" -> "--tee or -t".
std::string plain(std::string_view text);

// The docs' flag tables (--help=markdown): one row, each "|" inside a cell escaped.
std::string markdown_row(const std::vector<std::string>& cells);
// A default as a docs table shows it: the literal in backticks, words after it as they are
// ("0 (off)" -> "`0` (off)"); "" stays "".
std::string markdown_default(const std::string& shown);

}  // namespace ddprun::command_line
