// Rendering of listings for people (tables) and for programs (JSON).
#pragma once

#include <string>
#include <vector>

#include "shmcache/stats.h"

namespace shmcache::admin {

std::string SessionsTable(int port, const std::vector<SessionInfo>& sessions);
std::string SessionsJson(const std::vector<SessionInfo>& sessions);
std::string ServerInfoTable(const ServerInfo& info);
std::string ServerInfoJson(const ServerInfo& info);

}  // namespace shmcache::admin
