// What libshmcache.so exports. The library is built with hidden visibility
// (-fvisibility=hidden -fvisibility-inlines-hidden): only the classes and
// functions marked SHMCACHE_EXPORT here, in the public headers, are
// visible to programs that link it; everything in lib/ that is not
// declared under include/shmcache stays inside the library (and
// lib/libshmcache.map keeps the standard library's template objects in
// too). tests/exported_symbols_test.cc checks the dynamic symbol table.
#pragma once

// On a class: its out-of-line members (and its typeinfo) are exported.
// On a function: that function is.
#define SHMCACHE_EXPORT [[gnu::visibility("default")]]

// On a private member of an exported class that only the library itself
// calls (e.g. the constructor from the implementation object): not
// exported, so the symbol table names no internal type.
#define SHMCACHE_LOCAL [[gnu::visibility("hidden")]]
