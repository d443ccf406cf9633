// The rendezvous store as the backends use it: any Gloo store (FileStore, RedisStore, ...) with every
// wait bounded by the communicator's timeout. Gloo's own connectFullMesh and FileStore::get wait with
// Gloo's default of 30 s; through this wrapper a rank that never joins ends the rendezvous of the
// others within the timeout the job asked for.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace seqlab::dist {

class DeadlineStore : public gloo::rendezvous::Store {
 public:
  DeadlineStore(std::shared_ptr<gloo::rendezvous::Store> inner, std::chrono::milliseconds timeout)
      : inner_(std::move(inner)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override { inner_->set(key, data); }
  // Waits (up to the timeout) for the key to be set, then reads it.
  std::vector<char> get(const std::string& key) override {
    inner_->wait({key}, timeout_);
    return inner_->get(key);
  }
  void wait(const std::vector<std::string>& keys) override { inner_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    inner_->wait(keys, std::min(timeout, timeout_));
  }

 private:
  std::shared_ptr<gloo::rendezvous::Store> inner_;
  std::chrono::milliseconds timeout_;
};

}  // namespace seqlab::dist
