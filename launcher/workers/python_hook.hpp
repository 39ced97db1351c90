#pragma once
// ddprun's Python startup hook (python_hook/sitecustomize.py): ddprun writes it into its private
// run directory and puts that directory first on the workers' PYTHONPATH. It runs in every Python
// process the workers start, imports nothing heavy (never torch), and then runs the sitecustomize
// module it shadows, if any (Debian ships one), so nothing of the user's is lost.
//
// It does two things, each only when its variable is set by ddprun:
//   - stacks (DDPRUN_STACK_DIR, DDPRUN_STACK_SIGNAL; with --hang_timeout or torchelastic's file
//     timer): arms faulthandler on the signal to write every thread's traceback to
//     DDPRUN_STACK_DIR/python.<pid>.txt, in a process that leads its process group (a worker, not
//     its data loader processes); see stacks.hpp;
//   - the agent store on PyTorch without libuv (TORCHELASTIC_USE_AGENT_STORE=True, unless
//     DDPRUN_TORCH_HOOK=0): PyTorch >= 2.4 creates the env:// client of the agent's store with
//     use_libuv=True, its default, which a PyTorch built without libuv (Debian 13's 2.6) refuses
//     even for a client, which never uses libuv. When torch.distributed.rendezvous is imported, its
//     TCPStore is wrapped: a client created without a use_libuv of its own gets use_libuv=False.
//     A server, a client that chose, and a PyTorch without the option are left as they were.

#include <string>

namespace ddprun::launcher::workers {

// Writes DIR/sitecustomize.py and, with `fault_tolerance` (ddprun --replica_group), DIR/ddprun_ft.py
// (python_hook/ddprun_ft.py: the workers' side of fault-tolerant replica groups, imported by a
// worker that asks for it). Throws ProcessError if they cannot be written.
void write_python_hook(const std::string& dir, bool fault_tolerance = false);

// The text of python_hook/sitecustomize.py, built in (python_hook_source.cpp, made by CMake).
const char* python_hook_source();
// The text of python_hook/ddprun_ft.py.
const char* python_ft_source();

}  // namespace ddprun::launcher::workers
