#pragma once
// `branchgrpo weights`: the tensors of a safetensors checkpoint and how they match a FLUX layout (docs/cli.md).

namespace CLI {
class App;
}  // namespace CLI

namespace branchgrpo::cli {

/// Registers the `weights` subcommand on `app`. It lists the tensors of a `.safetensors` file or a sharded
/// `*.index.json` (name, dtype, shape), says which FLUX layout (bfl or diffusers) the names are in and which keys
/// are missing, unexpected or of the wrong shape for a FLUX config. A malformed file throws the reader's one-line
/// branchgrpo::invalid_input (naming the file and the tensor). Needs no LibTorch.
/// Example: `branchgrpo weights tiny.safetensors --json` -> {"config":"tiny",...,"layout":"bfl",...,"ok":true,...}.
void add_weights_command(CLI::App& app);

}  // namespace branchgrpo::cli
