#pragma once
// What the store itself knows of ddprun jobs: every job's keys live under /ddprun/<run id>/, one
// namespace per job, which per-job quotas count and a job's token is bound to. The layout inside
// a job's namespace (generations, rounds, heartbeats) is the launcher's and the daemon's, in
// rendezvous/jobs/job_keys.hpp. Pure: no I/O.

#include <string>
#include <string_view>

namespace ddprun::rdzv::core {

inline constexpr std::string_view kRoot = "/ddprun/";
// What ddprun-rendezvous says about itself, outside every job and readable by every client (JSON:
// {"durable": true when it keeps its state across restarts (--state-file), "boot": an id of this
// start}). A client that rides out a restart reads it on each connection.
inline constexpr std::string_view kStoreInfoKey = "/ddprun-store/info";

// Whether `run_id` can name a job (letters, digits and ". _ - :", so a key names its job
// unambiguously); `why` says what is wrong otherwise.
bool valid_run_id(std::string_view run_id, std::string* why = nullptr);

// <root><run_id>/: the job's namespace (the etcd backend's root is its key_prefix).
std::string job_prefix(std::string_view run_id, std::string_view root = kRoot);
// /ddprun/<run_id>/store_refusal: why the store last refused a request of this job (a quota or a
// store-wide limit), left by the store for the job's agents to read.
std::string refusal_note(std::string_view run_id);
// Whether `key` is a job's refusal note.
bool is_refusal_note(std::string_view key);
// The run id of a key under /ddprun/<run id>/ (any key there, ddprun's layout or not); empty for
// every other key.
std::string_view job_of_key(std::string_view key);

}  // namespace ddprun::rdzv::core
