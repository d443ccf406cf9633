#include "train/common/errors.h"

#include <absl/strings/str_replace.h>

#include <exception>
#include <iostream>
#include <new>

namespace seqlab::cli {

int run_guarded(const std::string& command, const std::function<void()>& body) {
  auto report = [&](const std::string& message) {
    std::cerr << "seqlab " << command << ": " << absl::StrReplaceAll(message, {{"\n", " "}}) << "\n";
  };
  try {
    body();
    return 0;
  } catch (const UserError& e) {
    report(e.what());
    return kUsageError;
  } catch (const std::invalid_argument& e) {
    report(e.what());
    return kUsageError;
  } catch (const std::bad_alloc&) {
    report("out of memory: an allocation failed (std::bad_alloc); the run needs more memory than this machine gave");
    return 1;
  } catch (const std::exception& e) {
    report(std::string("internal error: ") + e.what());
    return 1;
  } catch (...) {
    report("internal error: an exception that is not a std::exception");
    return 1;
  }
}

}  // namespace seqlab::cli
