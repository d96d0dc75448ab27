#pragma once
// The one way a run opens an input file. A directory opens and reads as empty, a FIFO blocks its reader until some
// writer comes (and SIGTERM does not end a blocked open), a link to /dev/zero reads for ever, and a huge file read
// whole exhausts memory: every reader (configs, safetensors files and indexes, checkpoint manifests and configs,
// metrics files, files hashed for their checksum) opens through open_input_file, which refuses all of these in one
// line before reading a byte.
//
//   input_kinds::config, manifest, ...   what a file is, for its messages, and the most bytes read of it
//   open_input_file(path, kind)          a read-only descriptor of a regular file within the kind's limit
//   read_input_file(path, kind)          the whole of such a file
//   file_digest(path)                    its size and XXH64, streamed in 1 MiB chunks (any size)
//
// POSIX (open with O_NONBLOCK, then fstat on the same descriptor): nothing can be swapped in between the check and
// the read, and opening a FIFO returns at once instead of blocking.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/hash.hpp"
#include "branchgrpo/core/memory.hpp"
#include "branchgrpo/core/numbers.hpp"

namespace branchgrpo {

/// What an input file is: its name in messages ("config file") and the most bytes a reader takes of it. The limits
/// are far above any real file of the kind and far below the memory of a machine that trains.
struct input_kind {
  std::string_view what;
  std::uint64_t max_bytes = std::numeric_limits<std::uint64_t>::max();
};

namespace input_kinds {
/// A TOML run config, given or kept in a checkpoint (a real one is a few kB; 1.3 M [[rewards]] entries are 40 MB).
inline constexpr input_kind config{.what = "config file", .max_bytes = std::uint64_t{4} << 20};
/// A checkpoint's manifest.txt (one line a file: a 64-rank sharded checkpoint is a few kB).
inline constexpr input_kind manifest{.what = "checkpoint manifest", .max_bytes = std::uint64_t{1} << 20};
/// metrics.jsonl / metrics.csv, read on resume to cut them after the checkpoint's iteration (about 1 kB an
/// iteration: 256 MiB is over 200,000 iterations).
inline constexpr input_kind metrics{.what = "metrics file", .max_bytes = std::uint64_t{256} << 20};
/// A sharded checkpoint's *.index.json (FLUX.1-dev's is 100 kB).
inline constexpr input_kind safetensors_index{.what = "safetensors index", .max_bytes = std::uint64_t{64} << 20};
/// A safetensors file: mapped, not read, so no limit here; its header is bounded by the parser.
inline constexpr input_kind safetensors{.what = "safetensors file"};
/// A file read for its checksum only: streamed in chunks, so any size.
inline constexpr input_kind hashed{.what = "file"};
/// A file a checkpoint's manifest lists (weights, optimizer state, a shard, the layout, the config), opened for its
/// size and checksum before it is read (streamed or mapped, so any size).
inline constexpr input_kind checkpoint_file{.what = "checkpoint file"};
}  // namespace input_kinds

/// The path as a message shows it: at most 160 characters, a longer one cut in the middle so that both the start
/// and the file name stay. Example: path_text("/a/b.toml") == "/a/b.toml"; a 5,000-character path gives its first
/// 78 characters, "...", and its last 79.
inline std::string path_text(const std::filesystem::path& path) { return echo_middle(path.string(), 160); }

/// What a path is, as the messages say it: "a directory", "a FIFO", "a socket", "a device", "a file", "a link"
/// (one that leads nowhere: dangling, or a loop), else "not a regular file".
inline const char* file_type_text(std::filesystem::file_type type) {
  using enum std::filesystem::file_type;
  switch (type) {
    case directory:
      return "a directory";
    case fifo:
      return "a FIFO";
    case socket:
      return "a socket";
    case block:
    case character:
      return "a device";
    case regular:
      return "a file";
    case symlink:
      return "a link";
    default:
      return "not a regular file";
  }
}

/// A regular file opened read-only, with the size it had when opened. Move-only; closes on destruction.
class input_file {
 public:
  input_file(int descriptor, std::uint64_t size, std::filesystem::path path, input_kind kind) noexcept
      : descriptor_(descriptor), size_(size), path_(std::move(path)), kind_(kind) {}
  input_file(input_file&& other) noexcept
      : descriptor_(std::exchange(other.descriptor_, -1)),
        size_(other.size_),
        path_(std::move(other.path_)),
        kind_(other.kind_) {}
  input_file& operator=(input_file&& other) noexcept {
    if (this != &other) {
      close();
      descriptor_ = std::exchange(other.descriptor_, -1);
      size_ = other.size_;
      path_ = std::move(other.path_);
      kind_ = other.kind_;
    }
    return *this;
  }
  input_file(const input_file&) = delete;
  input_file& operator=(const input_file&) = delete;
  ~input_file() { close(); }

  [[nodiscard]] int descriptor() const noexcept { return descriptor_; }
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

  /// Reads up to `buffer.size()` bytes at the current offset; returns how many (0 at the end). A read error throws
  /// invalid_input "<path>: cannot read the <kind>: <reason>".
  std::size_t read_some(std::span<char> buffer) const {
    for (;;) {
      const ::ssize_t got = ::read(descriptor_, buffer.data(), buffer.size());
      if (got >= 0) return static_cast<std::size_t>(got);
      if (errno != EINTR) fail(path_text(path_), ": cannot read the ", kind_.what, ": ", std::strerror(errno));
    }
  }

  /// The whole file: size() bytes, and an error when it grew or shrank while read (a file being written).
  [[nodiscard]] std::string read_all() const {
    std::string text(static_cast<std::size_t>(size_) + 1, '\0');  // one more: a file that grew is caught
    std::size_t have = 0;
    while (have < text.size()) {
      const std::size_t got = read_some(std::span(text).subspan(have));
      if (got == 0) break;
      have += got;
    }
    require(have == size_, path_text(path_), ": the ", kind_.what, " changed size while it was read (",
            byte_text(static_cast<double>(size_)), " when opened)");
    text.resize(have);
    return text;
  }

 private:
  void close() noexcept {
    if (descriptor_ >= 0) ::close(descriptor_);
    descriptor_ = -1;
  }

  int descriptor_ = -1;
  std::uint64_t size_ = 0;
  std::filesystem::path path_;
  input_kind kind_;
};

/// Opens `path` (links followed) for reading when it is a regular file of at most kind.max_bytes; never blocks.
/// Example: open_input_file("run.toml", input_kinds::config).size() == the file's size;
///   on a FIFO: throws "run.toml: is a FIFO, not a config file"; a directory: "...: is a directory, not a config
///   file"; a link to /dev/zero: "...: is a device, not a config file"; a 9 GB manifest: "iter-000002/manifest.txt:
///   9 GB is over the limit of 1.05 MB for a checkpoint manifest"; a link loop or a missing file:
///   "x.toml: cannot open the config file: Too many levels of symbolic links" (the system's reason).
/// @post the descriptor is open on a regular file, at offset 0, with size() <= kind.max_bytes.
inline input_file open_input_file(const std::filesystem::path& path, input_kind kind) {
  const std::string shown = path_text(path);
  // O_NONBLOCK: opening a FIFO returns at once (refused below); it has no effect on a regular file's reads.
  const int descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (descriptor < 0) fail(shown, ": cannot open the ", kind.what, ": ", std::strerror(errno));
  struct ::stat status {};
  if (::fstat(descriptor, &status) != 0) {
    const int error = errno;
    ::close(descriptor);
    fail(shown, ": cannot read the ", kind.what, ": ", std::strerror(error));
  }
  if (!S_ISREG(status.st_mode)) {
    ::close(descriptor);
    using enum std::filesystem::file_type;
    const std::filesystem::file_type type = S_ISDIR(status.st_mode)                              ? directory
                                            : S_ISFIFO(status.st_mode)                           ? fifo
                                            : S_ISSOCK(status.st_mode)                           ? socket
                                            : S_ISCHR(status.st_mode) || S_ISBLK(status.st_mode) ? character
                                                                                                 : unknown;
    fail(shown, ": is ", file_type_text(type), ", not a ", kind.what);
  }
  const auto size = static_cast<std::uint64_t>(status.st_size);
  if (size > kind.max_bytes) {
    ::close(descriptor);
    fail(shown, ": ", byte_text(static_cast<double>(size)), " is over the limit of ",
         byte_text(static_cast<double>(kind.max_bytes)), " for a ", kind.what);
  }
  // Back to blocking reads: a regular file never blocks, and EAGAIN must not be taken for an error.
  ::fcntl(descriptor, F_SETFL, ::fcntl(descriptor, F_GETFL) & ~O_NONBLOCK);
  return input_file(descriptor, size, path, kind);
}

/// The whole of `path`, opened by open_input_file. Example: read_input_file("run.toml", input_kinds::config)
/// == "[run]\n" for a file holding that line.
inline std::string read_input_file(const std::filesystem::path& path, input_kind kind) {
  return open_input_file(path, kind).read_all();
}

/// The size and XXH64 (seed 0) of a whole file.
struct file_digest_result {
  std::uint64_t size = 0;
  std::uint64_t xxh64 = 0;
  friend bool operator==(const file_digest_result&, const file_digest_result&) = default;
};

/// Reads `path` (opened by open_input_file, any size) in 1 MiB chunks and returns its size and XXH64.
/// Example: a file holding "abc" gives {.size = 3, .xxh64 = 0x44bc2cf5ad770999}; a FIFO throws
///   "x.bin: is a FIFO, not a file".
/// @post out.size is the number of bytes read, which equals the size the file had when opened.
inline file_digest_result file_digest(const std::filesystem::path& path, input_kind kind = input_kinds::hashed) {
  const input_file file = open_input_file(path, kind);
  xxh64 hash;
  std::vector<char> chunk(std::size_t{1} << 20);
  file_digest_result out;
  for (std::size_t got; (got = file.read_some(chunk)) > 0;) {
    hash.update(chunk.data(), got);
    out.size += got;
  }
  require(out.size == file.size(), path_text(path), ": the ", kind.what, " changed size while its checksum was read");
  out.xxh64 = hash.digest();
  return out;
}

}  // namespace branchgrpo
