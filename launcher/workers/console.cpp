#include "launcher/workers/console.hpp"

namespace ddprun::launcher::workers {

Consoles& consoles() {
  static Consoles c;
  return c;
}

}  // namespace ddprun::launcher::workers
