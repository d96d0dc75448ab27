#pragma once
// Rewards on decoded images (docs/rewards.md), each modelling the core's Reward concept on torch_backend:
// leaves [rows, 3, H, W] RGB in [-1, 1] (the shapes model's pixels, or an autoencoder's output) plus one prompt
// index per row -> one score per row. A row holding a non-finite value scores NaN (the trainer drops its tree).
//
//   jpeg_compressibility{quality = 95}    -(JPEG size in kB), kB = 1000 bytes   (DDPO's "compressibility")
//   jpeg_incompressibility{quality = 95}  +(JPEG size in kB)                    (DDPO's "incompressibility")
//   shape_alignment{}                     colour and shape agreement of the image with a "a <colour> <shape>"
//                                         prompt, in [0, 1], from the pixels alone
//   weighted_sum({{name, weight, reward}, ...})   sum_i w_i r_i, each component's batch mean kept for logging
//
// Decoding to 8 bits (JPEG): v = clamp((x + 1) / 2, 0, 1), byte = round(255 v). JPEG through TurboJPEG's
// tjCompress2: 4:2:0 chroma subsampling, accurate (islow) DCT, standard Huffman tables, so the sizes equal
// PIL's Image.save(format="JPEG", quality=q) on libjpeg-turbo, DDPO's reward. Link libturbojpeg
// (CMake target branchgrpo_jpeg, cmake/jpeg.cmake).
//
// When to use: compressibility / incompressibility are cheap, prompt-free sanity rewards (alignment must move
// them within a few iterations; they are easy to hack: flat or noisy images). shape_alignment is the shipped
// demo model's task reward. Combine them with weighted_sum, e.g. alignment 1 + compressibility 0.1.
#include <turbojpeg.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/stop.hpp"
#include "branchgrpo/reward/win_rate.hpp"
#include "branchgrpo/torch/compat.hpp"

namespace branchgrpo {

namespace detail {

// [rows, 3, H, W] float32 CPU contiguous copy of the leaves, after checking their shape and the prompt count.
inline torch::Tensor reward_images(const torch::Tensor& leaves, std::span<const std::int64_t> prompts,
                                   const char* reward) {
  require(leaves.defined() && leaves.dim() == 4 && leaves.size(1) == 3, reward, " expects images [rows, 3, H, W], got ",
          leaves.defined() ? leaves.sizes() : c10::IntArrayRef{});
  require(leaves.size(2) >= 1 && leaves.size(3) >= 1, reward, ": empty image ", leaves.size(2), " x ", leaves.size(3));
  require(static_cast<std::int64_t>(prompts.size()) == leaves.size(0), reward, " got ", prompts.size(), " prompts for ",
          leaves.size(0), " rows");
  return leaves.detach().to(torch::kCPU, torch::kFloat32).contiguous();
}

// Whether every element of row r of `images` is finite.
inline bool row_finite(const torch::Tensor& images, std::int64_t r) {
  return torch::isfinite(images[r]).all().item<bool>();
}

struct turbojpeg_handle {
  tjhandle handle = tjInitCompress();
  turbojpeg_handle() { require(handle != nullptr, "TurboJPEG: cannot create a compressor"); }
  turbojpeg_handle(const turbojpeg_handle&) = delete;
  turbojpeg_handle& operator=(const turbojpeg_handle&) = delete;
  ~turbojpeg_handle() { tjDestroy(handle); }
};

}  // namespace detail

/// One image [3, H, W] in [-1, 1] as interleaved 8-bit RGB, row-major: byte = round(255 clamp((x + 1) / 2, 0, 1)).
/// Example: x = -1, 0, 1 -> 0, 128 (127.5 rounds away from zero), 255.
/// @pre image [3, H, W], finite.
inline std::vector<std::uint8_t> image_to_rgb8(const torch::Tensor& image) {
  require(image.dim() == 3 && image.size(0) == 3, "image_to_rgb8 expects [3, H, W], got ", image.sizes());
  const torch::Tensor hwc = image.detach().to(torch::kCPU, torch::kFloat64).permute({1, 2, 0}).contiguous();
  const double* data = hwc.data_ptr<double>();
  std::vector<std::uint8_t> out(static_cast<std::size_t>(hwc.numel()));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<std::uint8_t>(std::lround(255.0 * std::clamp((data[i] + 1.0) / 2.0, 0.0, 1.0)));
  return out;
}

/// Bytes of the baseline JPEG of an interleaved 8-bit RGB image (tjCompress2, 4:2:0, accurate DCT).
/// Example: 16 x 16 constant grey (128) at quality 95 -> 629 (libjpeg-turbo 2.1; headers and tables dominate).
/// @pre rgb.size() == width * height * 3, width and height >= 1, quality in [1, 100] (else invalid_input).
inline std::size_t jpeg_size(std::span<const std::uint8_t> rgb, int width, int height, int quality = 95) {
  require(width >= 1 && height >= 1, "jpeg_size: image of ", width, " x ", height, " pixels");
  require(rgb.size() == static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3,
          "jpeg_size: ", rgb.size(), " bytes for a ", width, " x ", height, " RGB image");
  require(quality >= 1 && quality <= 100, "JPEG quality must be in [1, 100], got ", quality);
  const detail::turbojpeg_handle compressor;
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const int status = tjCompress2(compressor.handle, rgb.data(), width, 0, height, TJPF_RGB, &buffer, &size, TJSAMP_420,
                                 quality, TJFLAG_ACCURATEDCT);
  const std::unique_ptr<unsigned char, void (*)(unsigned char*)> owned(buffer, [](unsigned char* p) { tjFree(p); });
  require(status == 0, "TurboJPEG: ", tjGetErrorStr2(compressor.handle));
  return static_cast<std::size_t>(size);
}

namespace detail {
// Per row: JPEG kB (bytes / 1000) of the decoded image, NaN for a non-finite row.
inline std::vector<double> jpeg_kilobytes(const torch::Tensor& leaves, std::span<const std::int64_t> prompts,
                                          int quality, const char* reward) {
  require(quality >= 1 && quality <= 100, reward, " quality must be in [1, 100], got ", quality);
  const torch::Tensor images = reward_images(leaves, prompts, reward);
  std::vector<double> out(static_cast<std::size_t>(images.size(0)));
  for (std::int64_t r = 0; r < images.size(0); ++r)
    out[static_cast<std::size_t>(r)] =
        row_finite(images, r)
            ? static_cast<double>(jpeg_size(image_to_rgb8(images[r]), static_cast<int>(images.size(3)),
                                            static_cast<int>(images.size(2)), quality)) /
                  1000.0
            : std::numeric_limits<double>::quiet_NaN();
  return out;
}
}  // namespace detail

/// DDPO's compressibility: r = -(JPEG size in kB) of the decoded image at `quality` (kB = 1000 bytes).
/// Example: quality 95, a 16 x 16 constant grey image (x = 0, bytes 128; 629 bytes of JPEG with libjpeg-turbo
///   2.1) -> -0.629; a flat image scores higher than a noisy one.
/// @pre leaves [rows, 3, H, W], one prompt per row (ignored); quality in [1, 100].
/// @post per row -size / 1000 < 0, or NaN when the row holds a non-finite value.
struct jpeg_compressibility {
  int quality = 95;

  std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> prompts) const {
    std::vector<double> out = detail::jpeg_kilobytes(leaves, prompts, quality, "jpeg_compressibility");
    for (double& value : out) value = -value;
    return out;
  }
  friend bool operator==(const jpeg_compressibility&, const jpeg_compressibility&) = default;
};

/// DDPO's incompressibility: r = +(JPEG size in kB) of the decoded image at `quality`.
/// Example: quality 95, the image of jpeg_compressibility's example -> 0.629.
/// @pre as jpeg_compressibility.  @post per row size / 1000 > 0, or NaN for a non-finite row.
struct jpeg_incompressibility {
  int quality = 95;

  std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> prompts) const {
    return detail::jpeg_kilobytes(leaves, prompts, quality, "jpeg_incompressibility");
  }
  friend bool operator==(const jpeg_incompressibility&, const jpeg_incompressibility&) = default;
};

/// What shape_alignment measures in one image (RGB in [0, 1] after v = clamp((x + 1) / 2, 0, 1)):
///   background b   per-channel median of the border pixels (the outermost ring)
///   d(p)           |v(p) - b| (Euclidean over RGB); the image has an object when max_p d(p) >= 0.25
///   foreground f   per-channel median of the pixels with d(p) >= 0.5 max d
///   coverage m(p)  clamp((a(p) - 0.15) / 0.7, 0, 1), a(p) = (v(p) - b).(f - b) / |f - b|^2 (unmixing: an edge
///                  pixel that is c parts shape has a = c)
///   area A = sum m, width W = sum over columns of the column's max m, height H likewise over rows
///   fill = A / (W H): the share of the bounding box the shape covers (circle pi/4, square 1, triangle 1/2;
///                  on the 16 x 16 data set 0.79, 0.99 and 0.58)
struct shape_features {
  bool object = false;
  std::array<double, 3> foreground{};
  std::array<double, 3> background{};
  double area = 0;
  double fill = 0;
};

/// The smallest image side measure_shape reads (a border ring around one pixel): the smallest image
/// shape_alignment scores, and the smallest frame moving_shape_alignment does (a run checks it before it starts).
inline constexpr std::int64_t shape_min_side = 3;

/// shape_features of one image [3, H, W] in [-1, 1] (see shape_features for the formulas).
/// Example: a 16 x 16 image of background 0.84 with the 6 x 6 square of rows and columns 5..10 at (0.8, -0.8, -0.8)
///   -> object, foreground (0.9, 0.1, 0.1), area 36, fill 1.
/// @pre image [3, H, W] with H, W >= 3, finite.
inline shape_features measure_shape(const torch::Tensor& image) {
  require(image.dim() == 3 && image.size(0) == 3 && image.size(1) >= shape_min_side && image.size(2) >= shape_min_side,
          "measure_shape expects [3, H, W] with H, W >= ", shape_min_side, ", got ", image.sizes());
  const torch::Tensor v = ((image.detach().to(torch::kCPU, torch::kFloat64) + 1.0) / 2.0).clamp(0.0, 1.0).contiguous();
  const std::int64_t h = v.size(1), w = v.size(2);
  const auto a = v.accessor<double, 3>();
  shape_features out;
  for (std::int64_t k = 0; k < 3; ++k) {
    std::vector<double> border;
    for (std::int64_t j = 0; j < w; ++j) border.insert(border.end(), {a[k][0][j], a[k][h - 1][j]});
    for (std::int64_t i = 1; i + 1 < h; ++i) border.insert(border.end(), {a[k][i][0], a[k][i][w - 1]});
    std::sort(border.begin(), border.end());
    const std::size_t m = border.size();
    out.background[static_cast<std::size_t>(k)] = m % 2 ? border[m / 2] : (border[m / 2 - 1] + border[m / 2]) / 2;
  }
  const auto& b = out.background;
  std::vector<double> distance(static_cast<std::size_t>(h * w));
  double farthest = 0;
  for (std::int64_t i = 0; i < h; ++i)
    for (std::int64_t j = 0; j < w; ++j) {
      double squared = 0;
      for (std::int64_t k = 0; k < 3; ++k) squared += std::pow(a[k][i][j] - b[static_cast<std::size_t>(k)], 2);
      distance[static_cast<std::size_t>(i * w + j)] = std::sqrt(squared);
      farthest = std::max(farthest, std::sqrt(squared));
    }
  if (farthest < 0.25) return out;
  // The object's colour: per-channel median of the pixels at least half as far from the background as the
  // farthest one (the median skips the anti-aliased edge pixels, a mean would mix in the background).
  std::array<double, 3> f{};
  for (std::int64_t k = 0; k < 3; ++k) {
    std::vector<double> values;
    for (std::int64_t i = 0; i < h; ++i)
      for (std::int64_t j = 0; j < w; ++j)
        if (distance[static_cast<std::size_t>(i * w + j)] >= 0.5 * farthest) values.push_back(a[k][i][j]);
    std::sort(values.begin(), values.end());
    const std::size_t m = values.size();
    f[static_cast<std::size_t>(k)] = m % 2 ? values[m / 2] : (values[m / 2 - 1] + values[m / 2]) / 2;
  }
  std::array<double, 3> axis{};
  double axis_squared = 0;
  for (std::size_t k = 0; k < 3; ++k) {
    axis[k] = f[k] - b[k];
    axis_squared += axis[k] * axis[k];
  }
  std::vector<double> column_max(static_cast<std::size_t>(w), 0.0), row_max(static_cast<std::size_t>(h), 0.0);
  double area = 0;
  for (std::int64_t i = 0; i < h; ++i)
    for (std::int64_t j = 0; j < w; ++j) {
      double projection = 0;
      for (std::int64_t k = 0; k < 3; ++k)
        projection += (a[k][i][j] - b[static_cast<std::size_t>(k)]) * axis[static_cast<std::size_t>(k)];
      const double m = std::clamp((projection / axis_squared - 0.15) / 0.7, 0.0, 1.0);
      area += m;
      column_max[static_cast<std::size_t>(j)] = std::max(column_max[static_cast<std::size_t>(j)], m);
      row_max[static_cast<std::size_t>(i)] = std::max(row_max[static_cast<std::size_t>(i)], m);
    }
  double width = 0, height = 0;
  for (const double m : column_max) width += m;
  for (const double m : row_max) height += m;
  out.object = true;
  out.foreground = f;
  out.area = area;
  out.fill = width * height > 0 ? area / (width * height) : 0.0;
  return out;
}

/// Prompt alignment of the shapes task from the image alone (measure_shape), in [0, 1]:
///   r = colour_weight s_colour + (1 - colour_weight) s_shape,
///   s_colour = exp(-|f - c_p|^2 / (2 colour_width^2))        c_p = shapes_palette[colour of the prompt]
///   s_shape  = exp(-(fill - fill_p)^2 / (2 fill_width^2))    fill_p = fill_targets[shape of the prompt]
/// and r = 0 when the image has no object. The prompt's colour and shape are the words of prompts[index]
/// (parse_shapes_prompt), so any prompt list naming one colour and one shape works.
/// Example: a pure red (0.9, 0.1, 0.1) 6 x 6 square on grey 0.92 for "a red square" -> s_colour 1, fill 1,
///   s_shape 1, r = 1; for "a red circle" -> s_shape exp(-(1 - 0.785)^2 / 0.0128) = 0.027, r = 0.513; for
///   "a blue square" -> |f - c_blue|^2 = 0.5625 + 0.0225 + 0.7225 = 1.3075, s_colour = exp(-16.3) ~ 0, r = 0.5.
/// @pre leaves [rows, 3, H, W] (H, W >= 3), prompts index `prompts`; colour_weight in [0, 1]; widths > 0.
/// @post per row a value in [0, 1], or NaN when the row holds a non-finite value.
struct shape_alignment {
  std::vector<std::string> prompts = shapes_prompts();
  double colour_weight = 0.5;
  double colour_width = 0.2;
  double fill_width = 0.08;
  /// circle, square, triangle: the ideal pi/4 and 1; the triangle's ideal 1/2 measures 0.58 on the data set
  /// (its apex rows cover less than a pixel, so H falls short of the bounding box).
  std::array<double, 3> fill_targets = {std::numbers::pi / 4, 1.0, 0.58};

  /// r of one image for a target.
  [[nodiscard]] double score(const torch::Tensor& image, const shapes_target& target) const {
    const shape_features features = measure_shape(image);
    if (!features.object) return 0.0;
    double squared = 0;
    for (std::size_t k = 0; k < 3; ++k)
      squared += std::pow(features.foreground[k] - shapes_palette[static_cast<std::size_t>(target.colour)][k], 2);
    const double colour = std::exp(-squared / (2 * colour_width * colour_width));
    const double gap = features.fill - fill_targets[static_cast<std::size_t>(target.shape)];
    const double shape = std::exp(-gap * gap / (2 * fill_width * fill_width));
    return colour_weight * colour + (1 - colour_weight) * shape;
  }

  std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> rows_prompts) const {
    require(colour_weight >= 0 && colour_weight <= 1, "shape_alignment colour_weight must be in [0, 1], got ",
            colour_weight);
    require(std::isfinite(colour_width) && colour_width > 0, "shape_alignment colour_width must be positive, got ",
            colour_width);
    require(std::isfinite(fill_width) && fill_width > 0, "shape_alignment fill_width must be positive, got ",
            fill_width);
    const torch::Tensor images = detail::reward_images(leaves, rows_prompts, "shape_alignment");
    std::vector<shapes_target> targets;
    for (const std::string& prompt : prompts) targets.push_back(parse_shapes_prompt(prompt));
    std::vector<double> out(rows_prompts.size());
    for (std::size_t r = 0; r < out.size(); ++r) {
      const std::int64_t p = rows_prompts[r];
      require(p >= 0 && p < static_cast<std::int64_t>(targets.size()), "shape_alignment row ", r, " has prompt ", p,
              ", the prompt list has ", targets.size());
      const auto row = static_cast<std::int64_t>(r);
      out[r] = detail::row_finite(images, row) ? score(images[row], targets[static_cast<std::size_t>(p)])
                                               : std::numeric_limits<double>::quiet_NaN();
    }
    return out;
  }
  friend bool operator==(const shape_alignment&, const shape_alignment&) = default;
};

/// A reward of a weighted_sum: its name (for logs), weight and scoring function, pointwise (`score`) or groupwise
/// (`score_groups`: sees each tree's leaves at once, e.g. win_rate over a pointwise scorer); exactly one is set.
struct named_reward {
  using pointwise = std::function<std::vector<double>(const torch::Tensor&, std::span<const std::int64_t>)>;
  using groupwise =
      std::function<std::vector<double>(const torch::Tensor&, std::span<const std::int64_t>, const leaf_groups&)>;
  /// Named parts behind the last call's scores, one value per row (a reward server's components): logged, never
  /// summed.
  using detail_rows = std::function<std::map<std::string, std::vector<double>>()>;
  std::string name;
  double weight = 1.0;
  pointwise score = {};
  groupwise score_groups = {};
  detail_rows details = {};
};

/// The sum and the count of the finite values of a span, in order; their mean is weighted_sum's component mean, and
/// sums of several ranks' (count exact as a double) give the mean over all of them.
/// Example: {1, NaN, 2} -> sum 3, count 2, mean 1.5; {NaN} -> sum 0, count 0, mean NaN.
struct finite_sum {
  double sum = 0;
  double count = 0;

  [[nodiscard]] static finite_sum of(std::span<const double> values) {
    finite_sum out;
    for (const double v : values)
      if (std::isfinite(v)) {
        out.sum += v;
        out.count += 1;
      }
    return out;
  }
  [[nodiscard]] double mean() const { return count > 0 ? sum / count : std::numeric_limits<double>::quiet_NaN(); }
};

/// Several rewards in one: r = sum_i weight_i r_i per row (NaN when any component is NaN for that row).
/// After each call, last_components() maps each name to the mean of its unweighted scores over the rows where
/// it is finite (NaN when none is), and each of a term's details to "<name>/<detail>" likewise (a server's
/// components: "remote/colour"); last_rows() maps the same keys to their per-row scores, for logging each reward
/// separately; and
/// last_component_rows() lists the parts with their weights (a ComponentReward: per_reward normalizes each).
/// Called with the leaves' groups (as the trainer does: a GroupwiseReward), groupwise terms get them; called
/// without, a groupwise term is refused.
/// Example: {{"align", 1, shape_alignment{}}, {"jpeg", 0.1, jpeg_compressibility{}}} on one image with
///   alignment 0.8 and JPEG 0.634 kB -> {0.8 - 0.0634} = {0.7366}; last_components() {align: 0.8, jpeg: -0.634}.
/// @pre at least one term; names unique and non-empty; weights finite; exactly one scoring function per term
///      (else invalid_input).
class weighted_sum {
 public:
  explicit weighted_sum(std::vector<named_reward> terms) : terms_(std::move(terms)) {
    require(!terms_.empty(), "weighted_sum needs at least one reward");
    std::set<std::string> names;
    for (std::size_t i = 0; i < terms_.size(); ++i) {
      const named_reward& term = terms_[i];
      require(!term.name.empty(), "weighted_sum reward ", i, " has no name");
      require(names.insert(term.name).second, "weighted_sum reward name '", term.name, "' appears twice");
      require(std::isfinite(term.weight), "weighted_sum reward '", term.name, "' has weight ", term.weight);
      require(static_cast<bool>(term.score) != static_cast<bool>(term.score_groups), "weighted_sum reward '", term.name,
              "' needs exactly one scoring function (pointwise or groupwise)");
    }
  }

  std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> prompts) {
    return score(leaves, prompts, nullptr);
  }

  std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> prompts,
                                 const leaf_groups& groups) {
    require(groups.rows() == prompts.size(), "weighted_sum: ", prompts.size(), " rows in ", groups.keys.size(),
            " groups of ", groups.leaves_per_tree);
    return score(leaves, prompts, &groups);
  }

  [[nodiscard]] const std::map<std::string, double>& last_components() const { return components_; }
  [[nodiscard]] const std::map<std::string, std::vector<double>>& last_rows() const { return rows_; }
  [[nodiscard]] std::span<const reward_component> last_component_rows() const { return parts_; }
  [[nodiscard]] std::span<const named_reward> terms() const { return terms_; }

 private:
  std::vector<double> score(const torch::Tensor& leaves, std::span<const std::int64_t> prompts,
                            const leaf_groups* groups) {
    std::vector<double> total(prompts.size(), 0.0);
    components_.clear();
    rows_.clear();
    parts_.clear();
    for (const named_reward& term : terms_) {
      check_stop("scoring");  // between rewards (core/stop.hpp); the server rewards also check between requests
      require(term.score || groups != nullptr, "weighted_sum reward '", term.name,
              "' is groupwise: it scores a leaf against its tree's, and this call gave no groups");
      std::vector<double> scores =
          term.score ? term.score(leaves, prompts) : term.score_groups(leaves, prompts, *groups);
      require(scores.size() == prompts.size(), "weighted_sum reward '", term.name, "' returned ", scores.size(),
              " scores for ", prompts.size(), " rows");
      for (std::size_t r = 0; r < scores.size(); ++r) total[r] += term.weight * scores[r];  // NaN: the row fails
      components_[term.name] = finite_mean(scores);
      parts_.push_back({.name = term.name, .weight = term.weight, .rows = scores});
      rows_[term.name] = std::move(scores);
      if (term.details)
        for (auto& [detail, values] : term.details()) {
          require(values.size() == prompts.size(), "weighted_sum reward '", term.name, "' detail '", detail, "' has ",
                  values.size(), " values for ", prompts.size(), " rows");
          components_[term.name + "/" + detail] = finite_mean(values);
          rows_[term.name + "/" + detail] = std::move(values);
        }
    }
    return total;
  }

  // The mean of the finite values (NaN when none is).
  static double finite_mean(std::span<const double> values) { return finite_sum::of(values).mean(); }

  std::vector<named_reward> terms_;
  std::map<std::string, double> components_;
  std::map<std::string, std::vector<double>> rows_;
  std::vector<reward_component> parts_;
};

}  // namespace branchgrpo
