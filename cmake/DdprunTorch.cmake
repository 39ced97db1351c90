# Finds LibTorch (Debian's libtorch-dev, or a CUDA LibTorch given through CMAKE_PREFIX_PATH) and NCCL.
# Sets DDPRUN_HAVE_TORCH, DDPRUN_HAVE_NCCL and DDPRUN_TORCH_HAS_CUDA, and says what it found.

set(DDPRUN_HAVE_TORCH OFF)
set(DDPRUN_HAVE_NCCL OFF)
set(DDPRUN_TORCH_HAS_CUDA OFF)

option(DDPRUN_WITH_TORCH "Build the Torch parts when LibTorch is found" ON)
if(DDPRUN_WITH_TORCH)
  find_package(Torch QUIET)
endif()

if(Torch_FOUND)
  set(DDPRUN_HAVE_TORCH ON)
  # A CUDA-enabled LibTorch exports torch_cuda (or defines CUDA libraries in TORCH_LIBRARIES).
  if(TARGET torch_cuda OR "${TORCH_LIBRARIES}" MATCHES "torch_cuda")
    set(DDPRUN_TORCH_HAS_CUDA ON)
  endif()
  message(STATUS "ddprun: LibTorch ${Torch_VERSION} found (CUDA: ${DDPRUN_TORCH_HAS_CUDA})")
else()
  message(STATUS "ddprun: LibTorch not found: worker SDK, examples and Torch tests are skipped")
endif()

# Gloo's headers, which ProcessGroupGloo.hpp includes: Debian's libtorch-dev depends on libgloo-dev
# (/usr/include/gloo); PyTorch's wheels link Gloo into libtorch_cpu but ship none of its headers.
# Without them the SDK offers the NCCL backend only and says so when asked for Gloo. Point
# DDPRUN_GLOO_INCLUDE_DIR at a directory holding gloo/algorithm.h to build the Gloo backend against a
# wheel (headers of a Gloo close to the wheel's own: ProcessGroupGloo's Store must override the same
# virtual functions).
set(DDPRUN_HAVE_GLOO_HEADERS OFF)
if(DDPRUN_HAVE_TORCH)
  find_path(DDPRUN_GLOO_INCLUDE_DIR gloo/algorithm.h HINTS ${TORCH_INCLUDE_DIRS})
  if(DDPRUN_GLOO_INCLUDE_DIR)
    set(DDPRUN_HAVE_GLOO_HEADERS ON)
  endif()
  message(STATUS "ddprun: Gloo headers for the Gloo backend: ${DDPRUN_HAVE_GLOO_HEADERS} (${DDPRUN_GLOO_INCLUDE_DIR})")
endif()

# Direct Gloo for DDP's CPU gradient buckets (worker_sdk/src/gloo_ring.hpp) needs Gloo's headers
# and the very libgloo that LibTorch links dynamically (Debian's libtorch does; wheels that link
# Gloo statically do not, and then DDP uses the process group).
set(DDPRUN_HAVE_DIRECT_GLOO OFF)
option(DDPRUN_WORKER_DIRECT_GLOO "Use a direct Gloo context for DDP's CPU gradient buckets when possible" ON)
if(DDPRUN_HAVE_TORCH AND DDPRUN_WORKER_DIRECT_GLOO)
  find_library(DDPRUN_GLOO_LIBRARY gloo)
  find_library(DDPRUN_TORCH_CPU_LIBRARY torch_cpu HINTS "${TORCH_INSTALL_PREFIX}/lib")
  if(DDPRUN_HAVE_GLOO_HEADERS AND EXISTS "${DDPRUN_GLOO_INCLUDE_DIR}/gloo/allreduce_halving_doubling.h"
     AND DDPRUN_GLOO_LIBRARY AND DDPRUN_TORCH_CPU_LIBRARY AND CMAKE_OBJDUMP)
    execute_process(COMMAND ${CMAKE_OBJDUMP} -p ${DDPRUN_TORCH_CPU_LIBRARY} OUTPUT_VARIABLE _ddprun_torch_dynamic
                    ERROR_QUIET)
    if(_ddprun_torch_dynamic MATCHES "NEEDED +libgloo")
      set(DDPRUN_HAVE_DIRECT_GLOO ON)
    endif()
  endif()
  message(STATUS "ddprun: direct Gloo reducer for DDP: ${DDPRUN_HAVE_DIRECT_GLOO}")
endif()

# Override with -DDDPRUN_NCCL_INCLUDE_DIR=... -DDDPRUN_NCCL_LIBRARY=... (e.g. the nvidia-nccl wheel's
# site-packages/nvidia/nccl/{include,lib}), or set NCCL_HOME.
find_path(DDPRUN_NCCL_INCLUDE_DIR nccl.h
  HINTS ENV NCCL_HOME ENV NCCL_ROOT ENV CUDA_HOME /usr/local/cuda
  PATH_SUFFIXES include)
find_library(DDPRUN_NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS ENV NCCL_HOME ENV NCCL_ROOT ENV CUDA_HOME /usr/local/cuda
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu targets/x86_64-linux/lib)

# The CUDA runtime, for ddprun::worker_nccl (raw NCCL communicator; no CUDA LibTorch needed).
find_path(DDPRUN_CUDART_INCLUDE_DIR cuda_runtime_api.h
  HINTS ENV CUDA_HOME /usr/local/cuda
  PATH_SUFFIXES include targets/x86_64-linux/include)
find_library(DDPRUN_CUDART_LIBRARY NAMES cudart libcudart.so.13 libcudart.so.12
  HINTS ENV CUDA_HOME /usr/local/cuda
  PATH_SUFFIXES lib64 lib targets/x86_64-linux/lib)
set(DDPRUN_HAVE_NCCL_COMM OFF)
if(DDPRUN_HAVE_TORCH AND DDPRUN_NCCL_INCLUDE_DIR AND DDPRUN_NCCL_LIBRARY AND DDPRUN_CUDART_INCLUDE_DIR
   AND DDPRUN_CUDART_LIBRARY)
  set(DDPRUN_HAVE_NCCL_COMM ON)
  message(STATUS "ddprun: NCCL and the CUDA runtime found: ddprun::worker_nccl and nccl_smoke are built")
endif()

if(DDPRUN_NCCL_INCLUDE_DIR AND DDPRUN_NCCL_LIBRARY)
  if(DDPRUN_TORCH_HAS_CUDA)
    set(DDPRUN_HAVE_NCCL ON)
    message(STATUS "ddprun: NCCL found (${DDPRUN_NCCL_INCLUDE_DIR}/nccl.h) with a CUDA LibTorch: NCCL backend on")
  else()
    message(STATUS "ddprun: NCCL found (${DDPRUN_NCCL_INCLUDE_DIR}/nccl.h) but LibTorch has no CUDA: NCCL backend off")
  endif()
else()
  message(STATUS "ddprun: nccl.h/libnccl not found: NCCL backend off")
endif()

if(DDPRUN_HAVE_TORCH AND NOT TARGET ddprun_torch)
  # One interface target carrying LibTorch's headers, libraries and flags.
  add_library(ddprun_torch INTERFACE)
  target_include_directories(ddprun_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
  target_link_libraries(ddprun_torch INTERFACE ${TORCH_LIBRARIES})
  separate_arguments(_ddprun_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(ddprun_torch INTERFACE ${_ddprun_torch_flags})
endif()
