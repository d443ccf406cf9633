// What marks who wrote something, and when: the time in UTC and 128 random bits, written into a run
// folder's lock (checkpoint/run_folder.h), a run's identity (checkpoint/checkpoint.h) and a launch's
// token (launch/launcher.h).
#pragma once

#include <string>

namespace seqlab::cli {  // the namespace of src/train's shared helpers (errors.h says why)

// The current time in UTC as 2026-11-27T16:06:29Z (lock holders, run identities).
std::string utc_timestamp();
// 128 bits from the system's random source as 32 lowercase hex digits (run ids, launch tokens).
std::string random_hex128();

}  // namespace seqlab::cli
