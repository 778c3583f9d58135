// Readiness and stop notices for systemd's Type=notify units, through
// libsystemd's sd_notify() when the daemon is built with it (meson option
// -Dsystemd, on when libsystemd-dev is found). Without libsystemd, or when
// systemd did not start the daemon ($NOTIFY_SOCKET unset), they do nothing.
#pragma once

#include <string>

namespace shmcache {

// True when built with libsystemd.
bool SystemdNotifySupported();
// The server listens and serves: systemd starts the units ordered after it.
void NotifyReady(const std::string& status);
// The server began its clean shutdown.
void NotifyStopping();

}  // namespace shmcache
