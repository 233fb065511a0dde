// The tcp:// rendezvous's job secret: where the token comes from, whether a rendezvous may run
// without one, the key derived from it, and the handshake's proofs under that key (the
// handshake itself: tcp_store.h; the threat model: docs/DESIGN.md#threat-model).
#pragma once

#include <array>
#include <cstddef>
#include <string>

namespace shardload {

// The rendezvous key for TOKEN (empty: no token).
using TcpStoreKey = std::array<unsigned char, 32>;
TcpStoreKey tcp_store_key(const std::string &token);

// The job's secret from SHARDLOAD_TOKEN or SHARDLOAD_TOKEN_FILE, in *TOKEN (empty when neither
// is set). False, with *ERR saying what to fix, when a variable is set but unusable.
bool tcp_store_token(std::string *token, std::string *err);

// Whether a tcp:// rendezvous at HOST may run: with a token always; without one only on a
// loopback address or with SHARDLOAD_INSECURE_RENDEZVOUS=1. False with *ERR saying how to set
// a token and how to opt out.
bool tcp_store_allowed(const std::string &url, bool loopback, bool have_token, std::string *err);

// For the store's server and client only (tcp_store_server.cc, tcp_store.cc).
namespace tcp_store_auth {

constexpr size_t kNonce = 32; // bytes of each side's handshake nonce

// Initialises libsodium; throws std::runtime_error when it cannot.
void need_sodium();

// kNonce random bytes.
std::string random_nonce();

// The handshake proof of ROLE ('S' the server, 'C' the client) for the RANK and WORLD the
// client claims and both nonces, CN the client's and SN the server's.
std::string proof(const TcpStoreKey &key, char role, long rank, long world, const std::string &cn,
                  const std::string &sn);

// Whether MAC is that proof; in constant time.
bool proof_ok(const TcpStoreKey &key, const std::string &mac, char role, long rank, long world,
              const std::string &cn, const std::string &sn);

} // namespace tcp_store_auth
} // namespace shardload
