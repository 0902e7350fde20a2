#pragma once
//! \file
//! \brief Whole-file writes that a crash cannot tear: gravac's checkpoints use it, and a
//! training loop can write its own run state (model, optimizer, data position) with it.

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <thread>

#if __has_include(<unistd.h>) && __has_include(<fcntl.h>)
#include <fcntl.h>
#include <unistd.h>
#define GRAVAC_HAVE_POSIX_FILES 1
#endif

#include "gravac/core/error.hpp"

namespace gravac {

//! Writes \p bytes to \p path so that a crash (of the process or the machine) leaves
//! either the old file or the new one, never a torn one: a temporary file in the same
//! directory is written, flushed to disk (fsync), renamed over \p path, and the directory
//! is synced so that the rename itself survives. Throws gravac::error(io_failure) naming
//! the file and the system's reason (errno); the temporary file is then removed and
//! \p path is untouched.
inline void write_file_atomically(const std::string& path, std::span<const std::byte> bytes) {
  // Per thread: ranks that run as threads of one process may write side by side.
  const std::string tmp =
      path + ".tmp-" + std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()) & 0xffffffu);
  const auto fail = [&](const std::string& what, int err) {
    return error(status::io_failure, what + ": " + std::strerror(err), -1, backend::io);
  };
#ifdef GRAVAC_HAVE_POSIX_FILES
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw fail("cannot create '" + tmp + "'", errno);
  std::size_t at = 0;
  int err = 0;
  while (at < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + at, bytes.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    at += static_cast<std::size_t>(n);
  }
  // fsync before the rename: otherwise a crash of the machine can leave the new name on a
  // file whose data never reached the disk.
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw fail("cannot write '" + tmp + "' (disk full?)", err);
  }
#else
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw fail("cannot create '" + tmp + "'", errno);
  const bool wrote = bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const int err = errno;
  const bool closed = std::fflush(f) == 0 && std::fclose(f) == 0;
  if (!wrote || !closed) {
    std::remove(tmp.c_str());
    throw fail("cannot write '" + tmp + "' (disk full?)", err);
  }
#endif
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw fail("cannot rename '" + tmp + "' to '" + path + "'", e);
  }
#ifdef GRAVAC_HAVE_POSIX_FILES
  // The rename is durable once the directory is synced (best effort: some file systems
  // cannot sync a directory, and the data is safe either way).
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
#endif
}

}  // namespace gravac
