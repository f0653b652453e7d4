// Writing output files so that a failure leaves nothing that looks written: every writer
// (checkpoints, convert, predict, export) writes NAME.tmp, checks each close and flush,
// commits with fsync + rename + directory fsync, and on a failure removes the .tmp. A full
// file system (ENOSPC, EDQUOT) gets one message that says so and names the path, whatever
// layer (HDF5, MPI-IO, a plain write) met it. Space can be reserved before a parallel HDF5
// file is written: HDF5 cannot agree across ranks on a write error inside its collective
// metadata flush (peers wait in different collectives for ever), so a collective writer
// makes sure its writes cannot run out of space before HDF5 starts.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace ringtrain::io {

// Whether an errno means the file system has no room (ENOSPC, EDQUOT).
bool no_space_errno(int err);
// Bytes an unprivileged process can still write on the file system holding `path` (a
// file or directory, existing or not: its nearest existing ancestor is asked); -1 unknown.
int64_t free_bytes(const std::string& path);
// Whether a write to `path` that failed with `cause` (HDF5's stack, MPI's or the system's
// error text) failed for lack of space: the text says so, or the file system holding it
// has less than 1 MiB left.
bool failed_for_space(const std::string& path, const std::string& cause);
// "the file system holding 'DIR' is full (ENOSPC, 12 KiB free)" (or, with 1 MiB or more
// free, "(ENOSPC, no space left on device or quota exceeded)")
std::string full_disk_note(const std::string& path);
// The message for a full file system:
// "<doing> '<path>' failed; the file system holding 'DIR' is full (ENOSPC, N KiB free)"
// followed by "; <after>" when after is not empty.
std::string disk_full_message(const std::string& doing, const std::string& path,
                              const std::string& after = "");
// Throws it as a runtime error (exit 2).
[[noreturn]] void throw_disk_full(const std::string& doing, const std::string& path,
                                  const std::string& after = "");

// Commits a complete output: fsyncs tmp, renames it to `path`, fsyncs the directory. A
// failure throws (the full-disk message when it is one) and leaves tmp for the caller to
// remove.
void commit_output(const std::string& tmp, const std::string& path);
// Writes the pieces (pointer, bytes) one after the other as the whole of `path` (created
// or truncated), checking every write and the close; a failure throws a runtime error with
// the system's words (ENOSPC: "No space left on device").
void write_whole_file(const std::string& path,
                      std::initializer_list<std::pair<const void*, size_t>> pieces);
// Removes `path` if it exists, ignoring errors (the cleanup of a failed write).
void remove_quietly(const std::string& path);

// All of `paths` or none: runs write(), which writes each PATH as PATH.tmp (setting
// *current to the PATH it is at, for the message), then commits them (commit_output). On
// any error every .tmp, and every PATH already committed, is removed and the error
// rethrown, as the full-disk message ("writing '<current>' failed; ...; nothing was
// written") when the file system is full. One process writes them all.
void write_outputs(const std::vector<std::string>& paths,
                   const std::function<void(std::string* current)>& write);
// Rethrows the exception being handled, as the full-disk message when `path` failed for
// lack of space, after remove() has cleaned up (the free space is measured before it).
[[noreturn]] void rethrow_write_failure(const std::string& path,
                                        const std::function<void()>& remove);

// Creates (truncates) `path` empty and reserves `bytes` of space for it beyond its end
// (fallocate with FALLOC_FL_KEEP_SIZE: the file stays empty, so HDF5 creates it as new, and
// its later writes up to that size cannot fail for lack of space). Returns 0 or the errno of
// the failure (ENOSPC when it does not fit). Where the file system cannot reserve
// (EOPNOTSUPP), the free space is compared instead: ENOSPC when it is smaller.
int reserve_output(const std::string& path, uint64_t bytes);
// Gives back what the reservation holds beyond the end of the finished file.
void release_unused_reserve(const std::string& path);

}  // namespace ringtrain::io
