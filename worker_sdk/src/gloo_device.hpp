#pragma once
// The Gloo transport device a worker uses, chosen as PyTorch does: GLOO_SOCKET_IFNAME names the
// interface; otherwise the address the host name resolves to; otherwise loopback.

#include <memory>

namespace gloo::transport {
class Device;
}

namespace ddprun::worker::detail {

std::shared_ptr<gloo::transport::Device> make_gloo_device();

}  // namespace ddprun::worker::detail
