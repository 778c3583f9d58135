// Redis (Debian's redis-server on a Unix socket, persistence off) through
// hiredis: GET and SET of the same rows, one request at a time and
// pipelined. Every process opens its own connection.
#include <cstring>
#include <string>
#include <vector>

#include <hiredis/hiredis.h>

#include "benchmarks/sections.h"

namespace bench {
namespace {

redisContext* Connect(const std::string& path, std::string* err) {
  redisContext* ctx = redisConnectUnix(path.c_str());
  if (ctx == nullptr || ctx->err) {
    *err = ctx ? ctx->errstr : "cannot allocate a context";
    if (ctx) redisFree(ctx);
    return nullptr;
  }
  return ctx;
}

bool Ok(redisReply* rep) {
  bool ok = rep != nullptr && rep->type != REDIS_REPLY_ERROR;
  if (rep) freeReplyObject(rep);
  return ok;
}

std::string Key(uint64_t id) { return "r:" + std::to_string(id); }

}  // namespace

void BenchRedis(const Config& c, const Source& src, Report* r) {
  std::string err;
  redisContext* ctx = Connect(c.redis_socket, &err);
  if (ctx == nullptr) {
    r->Skip("redis", "cannot connect to " + c.redis_socket + ": " + err);
    return;
  }
  const int depth = c.pipeline_depth;
  for (size_t size : kRowSizes) {
    const uint32_t n = static_cast<uint32_t>(c.RowsFor(size));
    Ok(static_cast<redisReply*>(redisCommand(ctx, "FLUSHALL")));
    // Load every row, pipelined (this is also the pipelined SET figure).
    double t0 = NowSec();
    bool ok = true;
    for (uint32_t id = 0; id < n; id += static_cast<uint32_t>(depth)) {
      uint32_t end = std::min<uint32_t>(n, id + static_cast<uint32_t>(depth));
      for (uint32_t j = id; j < end; ++j) {
        std::string key = Key(j);
        redisAppendCommand(ctx, "SET %b %b", key.data(), key.size(), src.Row(j, size),
                           size);
      }
      for (uint32_t j = id; j < end; ++j) {
        void* rep = nullptr;
        ok &= redisGetReply(ctx, &rep) == REDIS_OK && Ok(static_cast<redisReply*>(rep));
      }
    }
    if (!ok) {
      r->Skip("redis " + std::to_string(size), "SET failed");
      continue;
    }
    r->Add("put", "redis", "SET pipelined", size, 1, n / (NowSec() - t0));
    const std::vector<uint32_t> idx = RandomIndices(1u << 20, n, 42 + size);
    const uint64_t mask = idx.size() - 1;

    // SET one at a time (overwrites rows already there).
    double rate = RunProcs(1, [&](int) {
      std::string e;
      redisContext* cx = Connect(c.redis_socket, &e);
      if (!cx) return -1.0;
      bool good = true;
      double rr = TimedRate(c.seconds, [&](uint64_t i) {
        uint32_t id = idx[i & mask];
        std::string key = Key(id);
        good &= Ok(static_cast<redisReply*>(redisCommand(
            cx, "SET %b %b", key.data(), key.size(), src.Row(id, size), size)));
      });
      redisFree(cx);
      return good ? rr : -1.0;
    });
    if (rate >= 0) r->Add("put", "redis", "SET", size, 1, rate);

    for (int p : c.procs) {
      for (bool pipelined : {false, true}) {
        rate = RunProcs(p, [&](int child) {
          std::string e;
          redisContext* cx = Connect(c.redis_socket, &e);
          if (!cx) return -1.0;
          std::vector<char> dst(size);
          const uint64_t off = static_cast<uint64_t>(child) * 7919;
          bool good = true;
          auto take = [&](redisReply* rep) {
            if (rep == nullptr || rep->type != REDIS_REPLY_STRING ||
                static_cast<size_t>(rep->len) != size) {
              good = false;
            } else {
              // The reply is already a private copy; a reader still needs the
              // row in its own buffer, as with a copy-out get.
              std::memcpy(dst.data(), rep->str, size);
            }
            if (rep) freeReplyObject(rep);
          };
          double rr;
          if (!pipelined) {
            rr = TimedRate(c.seconds, [&](uint64_t i) {
              std::string key = Key(idx[(i + off) & mask]);
              take(static_cast<redisReply*>(
                  redisCommand(cx, "GET %b", key.data(), key.size())));
            });
          } else {
            rr = TimedRateBatched(c.seconds, depth, [&](uint64_t i) {
              for (int j = 0; j < depth; ++j) {
                std::string key = Key(idx[(i * depth + j + off) & mask]);
                redisAppendCommand(cx, "GET %b", key.data(), key.size());
              }
              for (int j = 0; j < depth; ++j) {
                void* rep = nullptr;
                if (redisGetReply(cx, &rep) != REDIS_OK) good = false;
                take(static_cast<redisReply*>(rep));
              }
            });
          }
          redisFree(cx);
          return good ? rr : -1.0;
        });
        std::string v = pipelined ? "GET pipelined x" + std::to_string(depth) : "GET";
        if (rate < 0) r->Skip("redis " + v, "GET failed");
        else r->Add("get", "redis", v, size, p, rate);
      }
    }
  }
  Ok(static_cast<redisReply*>(redisCommand(ctx, "FLUSHALL")));
  redisFree(ctx);
}

}  // namespace bench
