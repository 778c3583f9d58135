// A word as a POSIX shell reads it back, for commands a message suggests
// ("stop it with 'SHMCACHE_RUN_DIR=/tmp/my\ dir ...'"): a path with a space
// or a quote must paste as one word.
#pragma once

#include <string>

namespace shmcache {

// `word` as is when every character is one a shell takes literally (letters,
// digits and @%+=:,./_-), else in single quotes, each ' in it written '"'"'
// (Python's shlex.quote). "" gives ''. Pure; thread-safe.
std::string ShellQuote(const std::string& word);

}  // namespace shmcache
