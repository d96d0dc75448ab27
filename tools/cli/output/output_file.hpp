#pragma once
// Every byte the tool writes goes through these, and every failure (a full disk, /dev/full, a closed pipe, a
// missing directory) is an error naming the path and the system's reason, e.g.
// "out/toy/curves.csv: cannot write: No space left on device", and a non-zero exit (main.cpp).
//
//   write_file(path, bytes)       a whole file: a regular file is replaced atomically (temporary beside it,
//                                 fsync, rename), so a failure leaves the old file or none, never a 0-byte one;
//                                 a device or FIFO (/dev/full, /dev/stdout) is written in place; a FIFO that no
//                                 process reads is an error, never a blocked open
//   append_to_file(path, line)    one write(2) in O_APPEND mode, then fsync: a kill loses at most this line
//   check_standard_output()       flushes std::cout; throws when anything written to it failed, with the reason
//                                 (standard_output_buffer, installed by main.cpp, remembers it)
//   make_directory(dir)           a command's output directory, created and checked writable before any work
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <string_view>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/files/input_file.hpp"

namespace branchgrpo::cli {

/// A write failure: "<path>: <what>: <the system's reason>".
class write_error : public std::runtime_error {
 public:
  write_error(const std::filesystem::path& path, std::string_view what, int error)
      : std::runtime_error(path.string() + ": " + std::string(what) +
                           (error != 0 ? ": " + std::string(std::strerror(error)) : std::string())) {}
};

namespace detail {
// Writes all of `bytes` to `fd` (retrying short writes and EINTR); returns 0 or the errno of the failure.
inline int write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ::ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) return errno;
    if (written == 0) return EIO;
    bytes.remove_prefix(static_cast<std::size_t>(written));
  }
  return 0;
}

// Opens `path` for writing without blocking: a FIFO that no process reads is refused at once (ENXIO) instead of
// blocking the run until a reader comes (SIGTERM cannot end a blocked open); then the descriptor blocks again, so
// that writes wait for a slow reader. Throws write_error naming the path.
inline int open_for_writing(const std::filesystem::path& path, int flags, std::string_view what) {
  const int fd = ::open(path.c_str(), flags | O_WRONLY | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ENXIO) throw write_error(path, "is a FIFO that no process reads", 0);
  if (fd < 0) throw write_error(path, what, errno);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

// Closes `fd`; a failure reported by close (NFS, some disks) counts as a write failure.
inline int close_checked(int fd) { return ::close(fd) == 0 || errno == EINTR ? 0 : errno; }
}  // namespace detail

/// Writes `bytes` as the whole content of `path` (see the file comment). Example:
/// write_file("/dev/full", "x") throws write_error "/dev/full: cannot write: No space left on device".
/// @post on return the file holds exactly `bytes`; on a throw a regular `path` is unchanged.
inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  struct ::stat info {};
  const bool special = ::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode);
  if (special) {  // a device or FIFO: no rename over it, and no fsync (it may not support one)
    const int fd = detail::open_for_writing(path, 0, "cannot open for writing");
    const int error = detail::write_all(fd, bytes);
    const int closed = detail::close_checked(fd);
    if (error != 0 || closed != 0) throw write_error(path, "cannot write", error != 0 ? error : closed);
    return;
  }
  static std::atomic<std::uint64_t> counter{0};
  std::filesystem::path temporary = path;
  temporary += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw write_error(path, "cannot create", errno);
  int error = detail::write_all(fd, bytes);
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  const int closed = detail::close_checked(fd);
  if (error == 0) error = closed;
  if (error == 0 && ::rename(temporary.c_str(), path.c_str()) != 0) error = errno;
  if (error != 0) {
    ::unlink(temporary.c_str());
    throw write_error(path, "cannot write", error);
  }
}

/// Creates `dir` (and parents) and creates and removes a file in it: every command that writes into a directory
/// (train, demo, compare, toy, pretrain) calls it before any work, so that a directory it cannot write is refused
/// then, not after the training. Throws invalid_input (exit 2: the user's to fix) naming the path when something
/// else is there ("out/checkpoints: is a file, not a directory"; a dangling link or a link loop likewise), when the
/// system refuses to create it ("/proc/x: cannot create the directory: No such file or directory") or a file in it
/// ("/sys: cannot write in the directory: Permission denied", a read-only file system); write_error (exit 1) when
/// the system itself fails (no space left, an I/O error).
/// @post `dir` is a directory in which this process could create a file; nothing is left in it.
inline std::filesystem::path make_directory(const std::filesystem::path& dir) {
  const auto refuse = [&](std::string_view what, int error) {
    if (error == ENOSPC || error == EDQUOT || error == EIO) throw write_error(dir, what, error);
    fail(path_text(dir), ": ", what, ": ", std::strerror(error));
  };
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  std::error_code type_error;
  if (error || !std::filesystem::is_directory(dir, type_error)) {
    // Something else at the path is named as what it is; else the system's reason.
    using enum std::filesystem::file_type;
    const std::filesystem::file_type type = std::filesystem::symlink_status(dir, type_error).type();
    if (type == symlink) fail(path_text(dir), ": is a link to no directory (dangling, or a loop), not a directory");
    if (type != not_found && type != none && type != directory)
      fail(path_text(dir), ": is ", file_type_text(type), ", not a directory");
    refuse("cannot create the directory", error ? error.value() : ENOTDIR);
  }
  // A directory may exist and refuse files (permissions, a read-only mount, /sys): try one, as the outputs will.
  std::filesystem::path probe = dir;
  probe /= ".branchgrpo-write-check-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0) refuse("cannot write in the directory", errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return dir;
}

/// Appends `bytes` (typically one line) to `path`, creating it: one write(2) in O_APPEND mode, then fsync.
/// @post on return the bytes are on disk after everything appended before; on a throw at most a part of them is.
inline void append_to_file(const std::filesystem::path& path, std::string_view bytes) {
  const int fd = detail::open_for_writing(path, O_APPEND | O_CREAT, "cannot open for appending");
  int error = detail::write_all(fd, bytes);
  if (error == 0 && ::fsync(fd) != 0 && errno != EINVAL) error = errno;  // EINVAL: a device without fsync
  const int closed = detail::close_checked(fd);
  if (error != 0 || closed != 0) throw write_error(path, "cannot write", error != 0 ? error : closed);
}

/// std::cout's buffer while the tool runs (main.cpp installs it): bytes go to file descriptor 1 with write(2),
/// and the first failure's errno is kept, so that check_standard_output can name the reason however long ago
/// the failing write happened (a stdio buffer forgets it). Once a write failed, later output is dropped.
class standard_output_buffer : public std::streambuf {
 public:
  standard_output_buffer() { setp(buffer_, buffer_ + sizeof buffer_); }
  standard_output_buffer(const standard_output_buffer&) = delete;
  standard_output_buffer& operator=(const standard_output_buffer&) = delete;
  ~standard_output_buffer() override { (void)sync(); }

  /// 0, or the errno of the first failed write.
  [[nodiscard]] int error() const { return error_; }

 protected:
  int_type overflow(int_type c) override {
    if (sync() != 0) return traits_type::eof();
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }
  int sync() override {
    const std::string_view pending(pbase(), static_cast<std::size_t>(pptr() - pbase()));
    if (error_ == 0 && !pending.empty()) error_ = detail::write_all(STDOUT_FILENO, pending);
    setp(buffer_, buffer_ + sizeof buffer_);
    return error_ == 0 ? 0 : -1;
  }

 private:
  char buffer_[1 << 16];
  int error_ = 0;
};

/// The buffer main.cpp installs into std::cout (nullptr before).
inline standard_output_buffer*& installed_standard_output() {
  static standard_output_buffer* buffer = nullptr;
  return buffer;
}

/// Installs a standard_output_buffer into std::cout for its lifetime (main.cpp: one for the whole run); restores
/// the previous buffer at the end, so that nothing writes through a dead buffer at exit.
class checked_standard_output {
 public:
  checked_standard_output() : previous_(std::cout.rdbuf(&buffer_)) { installed_standard_output() = &buffer_; }
  checked_standard_output(const checked_standard_output&) = delete;
  checked_standard_output& operator=(const checked_standard_output&) = delete;
  ~checked_standard_output() {
    std::cout.flush();
    std::cout.rdbuf(previous_);
    installed_standard_output() = nullptr;
  }

 private:
  standard_output_buffer buffer_;
  std::streambuf* previous_;
};

/// Flushes std::cout; throws write_error "standard output: cannot write: <reason>" when this or any earlier write
/// to it failed (e.g. `branchgrpo tree --json > /dev/full`). main.cpp calls it after every command; commands that
/// stream lines call it after each line to stop at the first failure.
inline void check_standard_output() {
  std::cout.flush();
  if (const standard_output_buffer* buffer = installed_standard_output(); buffer != nullptr) {
    if (buffer->error() != 0) throw write_error("standard output", "cannot write", buffer->error());
    return;
  }
  errno = 0;  // without the buffer (a test program): stdio's own state, its reason when still known
  if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0 || !std::cout)
    throw write_error("standard output", "cannot write", errno);
}

}  // namespace branchgrpo::cli
