#include "daemon/systemd_notify.h"

#ifdef SHMCACHE_HAVE_SYSTEMD
#include <unistd.h>

#include <fmt/format.h>
#include <systemd/sd-daemon.h>
#endif

namespace shmcache {

#ifdef SHMCACHE_HAVE_SYSTEMD

bool SystemdNotifySupported() { return true; }

void NotifyReady(const std::string& status) {
  // Errors are of no use here: systemd times the start out by itself.
  sd_notify(0, fmt::format("READY=1\nMAINPID={}\nSTATUS={}", getpid(), status).c_str());
}

void NotifyStopping() { sd_notify(0, "STOPPING=1"); }

#else

bool SystemdNotifySupported() { return false; }
void NotifyReady(const std::string&) {}
void NotifyStopping() {}

#endif

}  // namespace shmcache
