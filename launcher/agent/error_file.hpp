#pragma once
// ddprun's own TORCHELASTIC_ERROR_FILE, for whatever started it (another launcher, a scheduler), as
// torchrun's agent writes its own: the root cause's error when the job fails, ddprun's error when
// ddprun itself could not run it. And the workers' error files of a temporary run directory, whose
// text the reports keep once the directory is gone. Called by the agent's thread at the end of the
// job; each write replaces the file whole (common/replace_file.hpp).

#include <optional>
#include <string>
#include <vector>

#include "launcher/agent/job_report.hpp"
#include "launcher/workers/worker_exit.hpp"

namespace ddprun::launcher::agent {

// What torchrun writes for root cause `root` (ErrorHandler.dump_error_file): the worker's error
// file with its message's errorCode set to the exit code (-N for signal N, as torchrun counts it);
// for a worker whose file is not on this node (another node's), its error text in that format.
// nullopt when the worker wrote none (torchrun writes nothing then).
std::optional<std::string> root_cause_error_document(const workers::WorkerExit& root);

// Writes root_cause_error_document(root) to `path`; returns `path` once written, "" when there was
// nothing to write, no path, or the write failed (a warning says why).
std::string write_root_cause_error(const std::string& path, const workers::WorkerExit& root);

// ddprun's own error, as torchrun's record() writes an exception: {"message": {"message": ...}}.
void write_launcher_error(const std::string& path, const std::string& message);

// `e`'s error file, when it lies in `run_directory`, which is about to be removed: its text is
// kept in the record and its path becomes `kept_at` (the root cause's copy) or none ("").
void keep_error_text_of(workers::WorkerExit& e, const std::string& run_directory, const std::string& kept_at);

// The end of a failed job, `failures` the root cause first: the root cause's error to
// `launcher_error_file` (write_root_cause_error), and, when `temporary_run_directory` ("" when it is
// kept) goes at exit, its error files kept as text in `failures` and in `report`.
void settle_error_files(std::vector<workers::WorkerExit>& failures, const std::string& launcher_error_file,
                        const std::string& temporary_run_directory, JobReport& report);

}  // namespace ddprun::launcher::agent
