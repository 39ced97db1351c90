#pragma once
// The one exception hierarchy of ddprun. Every message is a sentence with context and cause;
// only main() functions turn these into exit codes.

#include <stdexcept>
#include <string>

namespace ddprun {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A flag, variable or file that the user must fix; reported before anything starts.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A peer could not be reached or went away.
class ConnectionError : public Error {
 public:
  using Error::Error;
};

// Something did not happen within its deadline; the message says what was awaited.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// Bytes on a store connection that do not follow the TCPStore wire format.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// A request that would take a store past one of its limits (total keys, total bytes, the size of
// one reply). The store refuses it, keeps everything it holds, and closes that connection.
class LimitError : public ProtocolError {
 public:
  using ProtocolError::ProtocolError;
};

// A client that has not proven the store's secret, or that reaches outside its job's keys. The
// store closes that connection without touching anything.
class AccessDenied : public ProtocolError {
 public:
  using ProtocolError::ProtocolError;
};

// A stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) arrived while ddprun waited for something; the
// state that was waiting has been left cleanly.
class StopRequested : public Error {
 public:
  explicit StopRequested(int signo) : Error("stopped by signal " + std::to_string(signo)), signo_(signo) {}
  int signal() const { return signo_; }

 private:
  int signo_;
};

// A child process could not be started, signalled or waited for.
class ProcessError : public Error {
 public:
  using Error::Error;
};

}  // namespace ddprun
