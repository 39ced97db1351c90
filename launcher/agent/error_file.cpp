#include "launcher/agent/error_file.hpp"

#include <chrono>
#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "common/replace_file.hpp"

namespace ddprun::launcher::agent {

using nlohmann::json;
using workers::WorkerExit;

namespace {

std::string timestamp(std::chrono::system_clock::time_point t) {
  return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count());
}

bool write(const std::string& path, const std::string& document) {
  ReplaceFile how;
  how.durability = Durability::Atomic;
  if (const auto failed = replace_file(path, document + "\n", how)) {
    log::warn("ddprun") << "cannot write TORCHELASTIC_ERROR_FILE " << path << ": " << failed->what();
    return false;
  }
  return true;
}

}  // namespace

std::optional<std::string> root_cause_error_document(const WorkerExit& root) {
  const int error_code = root.signal != 0 ? -root.signal : root.exit_code;
  if (root.error_document) {
    json j = json::parse(*root.error_document, nullptr, /*allow_exceptions=*/false);
    // As torchrun: the code goes where the message is an object (a worker a signal killed could not
    // write it).
    if (j.is_object() && j.contains("message") && j["message"].is_object()) j["message"]["errorCode"] = error_code;
    if (j.is_object()) return j.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  const auto& text = root.error_text;
  if (!text) return std::nullopt;
  const json j = {
      {"message",
       {{"message", *text}, {"extraInfo", {{"timestamp", timestamp(root.time)}}}, {"errorCode", error_code}}}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string write_root_cause_error(const std::string& path, const WorkerExit& root) {
  if (path.empty()) return "";
  const auto document = root_cause_error_document(root);
  if (!document || !write(path, *document)) return "";
  log::info("ddprun") << "rank " << root.rank << "'s error file is copied to " << path << " (TORCHELASTIC_ERROR_FILE)";
  return path;
}

void write_launcher_error(const std::string& path, const std::string& message) {
  if (path.empty()) return;
  const json j = {
      {"message",
       {{"message", "ddprun: " + message},
        {"extraInfo", {{"py_callstack", ""}, {"timestamp", timestamp(std::chrono::system_clock::now())}}}}}};
  write(path, j.dump(-1, ' ', false, json::error_handler_t::replace));
}

void keep_error_text_of(WorkerExit& e, const std::string& run_directory, const std::string& kept_at) {
  if (e.error_file.rfind(run_directory + "/", 0) == 0) keep_error_text(e, kept_at);
}

void settle_error_files(std::vector<WorkerExit>& failures, const std::string& launcher_error_file,
                        const std::string& temporary_run_directory, JobReport& report) {
  const std::string copy = failures.empty() ? "" : write_root_cause_error(launcher_error_file, failures.front());
  if (temporary_run_directory.empty()) return;
  for (size_t i = 0; i < failures.size(); ++i) keep_error_text_of(failures[i], temporary_run_directory, i ? "" : copy);
  report.keep_error_texts(temporary_run_directory, copy);
}

}  // namespace ddprun::launcher::agent
