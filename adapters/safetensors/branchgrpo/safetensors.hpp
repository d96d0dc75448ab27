#pragma once
// Safetensors reading and writing without LibTorch (the standard library and POSIX mmap only), so the
// `branchgrpo weights` tool and the fuzzer build in seconds. docs/safetensors.md describes every check.
//
// This header includes the whole family. Each one below also compiles alone; include just the one you need:
//   safetensors/dtype.hpp        safetensors_dtype: names, sizes, exact bf16/f16/f8_e4m3 -> float. For code that
//                                only names or sizes dtypes.
//   safetensors/tensor.hpp       safetensors_tensor, the view of one tensor's bytes; safetensors_max_header_bytes.
//   safetensors/header.hpp       parse_safetensors (a whole file already in memory) and parse_safetensors_index
//                                (a shard index's JSON), with every check of the format. For buffers you hold.
//   safetensors/mapped_file.hpp  safetensors_file (mmap + validate) and safetensors_checkpoint (one file or a
//                                sharded *.index.json as one view). For reading from disk.
//   safetensors/to_float.hpp     safetensors_to_float: any dtype, unaligned data, to float.
//   safetensors/writer.hpp       safetensors_entry, serialize_safetensors, write_safetensors (atomic).
//   safetensors/json.hpp         internals: the hand-written parser of the header's JSON subset.
//   safetensors/text.hpp         internals: quoting names in one-line messages, strict UTF-8.
#include "branchgrpo/safetensors/dtype.hpp"
#include "branchgrpo/safetensors/header.hpp"
#include "branchgrpo/safetensors/json.hpp"
#include "branchgrpo/safetensors/mapped_file.hpp"
#include "branchgrpo/safetensors/tensor.hpp"
#include "branchgrpo/safetensors/text.hpp"
#include "branchgrpo/safetensors/to_float.hpp"
#include "branchgrpo/safetensors/writer.hpp"
