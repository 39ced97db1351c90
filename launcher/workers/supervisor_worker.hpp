#pragma once
// Inside the Supervisor (supervisor.cpp, supervisor_hold.cpp): what it keeps of one worker.

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <array>
#include <memory>

#include "launcher/workers/output.hpp"
#include "launcher/workers/supervisor.hpp"

namespace ddprun::launcher::workers {

struct Supervisor::Worker {
  Worker(boost::asio::io_context& io, const WorkerLaunch& l) : launch(l), out_pipe(io), err_pipe(io) {}
  WorkerLaunch launch;
  pid_t pid = -1;
  bool exited = false;
  bool out_open = false;
  bool err_open = false;
  bool stopped_by_us = false;
  boost::asio::posix::stream_descriptor out_pipe;
  boost::asio::posix::stream_descriptor err_pipe;
  std::unique_ptr<LineWriter> out;
  std::unique_ptr<LineWriter> err;
  std::array<char, 16384> out_buf{};
  std::array<char, 16384> err_buf{};
};

}  // namespace ddprun::launcher::workers
