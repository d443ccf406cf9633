// The rendezvous store of a job on several machines that share no folder: Gloo's RedisStore, with every
// key under the job's name (communicator.h: open_redis_store).
#include <gloo/rendezvous/redis_store.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace seqlab::dist {
namespace {

// A store whose keys are "JOB/key" in `inner`: jobs that share one Redis server keep apart, as long as
// each has a name of its own (a Redis server keeps keys after a job ends).
class JobStore : public gloo::rendezvous::Store {
 public:
  JobStore(std::shared_ptr<gloo::rendezvous::Store> inner, std::string job) : inner_(std::move(inner)), job_(std::move(job)) {}

  void set(const std::string& key, const std::vector<char>& data) override { inner_->set(name(key), data); }
  std::vector<char> get(const std::string& key) override { return inner_->get(name(key)); }
  void wait(const std::vector<std::string>& keys) override { inner_->wait(names(keys)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    inner_->wait(names(keys), timeout);
  }

 private:
  std::string name(const std::string& key) const { return job_ + "/" + key; }
  std::vector<std::string> names(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const std::string& k : keys) out.push_back(name(k));
    return out;
  }
  std::shared_ptr<gloo::rendezvous::Store> inner_;
  std::string job_;
};

}  // namespace

std::shared_ptr<gloo::rendezvous::Store> open_redis_store(const std::string& host, int port, const std::string& job) {
  if (job.empty()) throw std::invalid_argument("rendezvous store: a Redis store needs a job name");
  std::shared_ptr<gloo::rendezvous::Store> redis;
  try {
    redis = std::make_shared<gloo::rendezvous::RedisStore>(host, port);
  } catch (const std::exception& e) {
    throw std::runtime_error("rendezvous store: cannot reach the Redis server at " + host + ":" + std::to_string(port) +
                             " (" + e.what() + ")");
  }
  return std::make_shared<JobStore>(std::move(redis), job);
}

}  // namespace seqlab::dist
