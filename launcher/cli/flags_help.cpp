// --help and --help=markdown (the flag tables of docs/guide.md), both made from the rows of the
// flag table (flags.cpp) and of the --rdzv_conf keys (options_rendezvous.cpp).
#include <sstream>

#include "common/command_line.hpp"
#include "launcher/cli/flags.hpp"
#include "launcher/cli/options.hpp"
#include "launcher/cli/options_parse.hpp"

namespace ddprun::launcher::cli {

using options_detail::split;

std::string usage_text(size_t width) {
  using command_line::print_option;
  using command_line::wrap;
  std::ostringstream out;
  out << "Usage: ddprun [options] PROGRAM [ARGS...]\n\n"
      << wrap(
             "Starts nproc_per_node workers of PROGRAM on this node with torchrun's environment (RANK, LOCAL_RANK, "
             "WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), hosts their rendezvous store, supervises them, and reports "
             "which rank failed and why. A PROGRAM ending in .py runs under $PYTHON_EXEC (default python3) -u; "
             "anything else is executed directly. '${local_rank}' in ARGS is replaced per worker.",
             width)
      << "\n"
      << wrap(
             "Dashes and underscores are interchangeable, a unique prefix of a flag stands for it (--nproc for "
             "--nproc_per_node), and each flag also reads PET_<NAME> from the environment.",
             width)
      << "\nOptions:\n";
  const LaunchOptions defaults;
  for (const FlagDef& f : flag_table()) {
    std::string names = *f.aliases ? std::string(f.aliases) + ", " + f.name : std::string(f.name);
    if (f.takes_value()) names += std::string(" ") + f.value;
    std::string help = f.help;
    if (f.env) help += std::string("; also read from ") + f.env;
    print_option(out, names, help, f.default_text(defaults), width);
  }
  print_option(out, "-h, --help",
               "show this help (--help=markdown: the flags and the --rdzv_conf keys as Markdown tables)", "", width);
  print_option(out, "--version", "print the version", "", width);
  out << "\n"
      << wrap(
             "--rdzv_conf keys (KEY=VALUE,...; a near miss of one is an error, other keys are ignored with a warning):",
             width);
  for (const RdzvConfKey& k : rdzv_conf_keys()) {
    std::string names = k.name;
    if (*k.aliases) names += std::string(" (also ") + k.aliases + ")";
    print_option(out, names, k.help, k.default_text(defaults), width);
  }
  out << "\nExit status:\n"
      << wrap(
             "0 when every worker succeeded; the root-cause worker's exit code (128+N if it died of signal N) when "
             "one failed; 124 when the job hung (--hang_timeout); 2 for a bad command line; 1 when ddprun itself "
             "could not run the job.",
             width, 2);
  return out.str();
}

std::string flag_table_markdown() {
  auto code = [](const std::string& s) { return "`" + s + "`"; };
  const LaunchOptions defaults;
  // A cell's default: the value in code, or the note's words as written.
  auto default_cell = [&](const auto& row) {
    return row.set.shown() ? command_line::markdown_default(row.default_text(defaults)) : std::string(row.note);
  };
  std::string out = "| flag | default | meaning |\n|---|---|---|\n";
  for (const FlagDef& f : flag_table()) {
    std::string name = f.name;
    if (f.optional_value) name += std::string("[=") + f.value + "]";
    std::string names = code(name);
    if (*f.aliases)
      names =
          std::string(f.aliases).rfind("--", 0) == 0 ? names + ", " + code(f.aliases) : code(f.aliases) + ", " + names;
    std::string meaning = f.help;
    if (f.env) meaning += std::string(" (also `") + f.env + "`; the flag wins)";
    if (f.see) meaning += std::string("; see ") + f.see;
    out += command_line::markdown_row({names, default_cell(f), meaning}) + "\n";
  }
  out += command_line::markdown_row({"`-h`, `--help` / `--version`", "",
                                     "every flag with its default (`--help=markdown`: these tables) / the version"}) +
         "\n";
  out +=
      "\n### `--rdzv_conf` keys\n\n"
      "Every key torchrun 2.x accepts is either honoured or accepted with the meaning below; `ddprun --help`\n"
      "lists them too. Booleans take `1/true/yes/on` or `0/false/no/off`.\n\n"
      "| key (torchrun's other spellings) | default | meaning in ddprun |\n|---|---|---|\n";
  for (const RdzvConfKey& k : rdzv_conf_keys()) {
    std::string names = code(k.name);
    if (*k.aliases) {
      std::string others;
      for (const std::string& alias : split(k.aliases, ',')) others += (others.empty() ? "" : ", ") + code(alias);
      names += " (" + others + ")";
    }
    std::string meaning = k.help;
    if (k.see) meaning += std::string("; see ") + k.see;
    out += command_line::markdown_row({names, default_cell(k), meaning}) + "\n";
  }
  return out;
}

}  // namespace ddprun::launcher::cli
