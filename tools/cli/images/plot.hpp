#pragma once
// A tiny raster plotter for the tool's PNGs: a canvas with clipped lines, discs, circles and 5x7 bitmap text,
// a line chart (axes, ticks, grid, legend) and a grid of scatter panels. No dependencies beyond png.hpp.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "cli/images/png.hpp"

namespace branchgrpo::cli {

struct rgb {
  std::uint8_t r = 0, g = 0, b = 0;
  friend bool operator==(const rgb&, const rgb&) = default;
};

inline constexpr rgb white{255, 255, 255};
inline constexpr rgb black{0, 0, 0};
inline constexpr rgb grid_grey{225, 225, 225};
inline constexpr rgb axis_grey{90, 90, 90};

/// Eight distinguishable colours (Tableau 10 without its grey and olive); series i uses palette[i % 8].
inline constexpr std::array<rgb, 8> palette = {rgb{31, 119, 180},  rgb{255, 127, 14},  rgb{44, 160, 44},
                                               rgb{214, 39, 40},   rgb{148, 103, 189}, rgb{140, 86, 75},
                                               rgb{227, 119, 194}, rgb{23, 190, 207}};

/// The 5 x 7 bitmap of `c`: 7 rows from the top, bit 4 the leftmost column. Digits, capitals (lowercase
/// letters draw as capitals), space and . , - + : ; / ( ) _ = %; any other character draws as a hollow box.
/// Example: glyph('1') == {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}; glyph('a') == glyph('A').
inline std::array<std::uint8_t, 7> glyph(char c) {
  struct entry {
    char c;
    std::array<std::uint8_t, 7> rows;
  };
  static constexpr entry font[] = {
      {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
      {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
      {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
      {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
      {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
      {'A', {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}}, {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
      {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}}, {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
      {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}}, {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
      {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}}, {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
      {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}}, {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
      {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}}, {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
      {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}}, {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
      {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
      {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}}, {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
      {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}}, {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
      {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
      {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}}, {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
      {'Y', {0x11, 0x11, 0x0A, 0x04, 0x04, 0x04, 0x04}}, {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
      {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}}, {',', {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}},
      {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}}, {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}},
      {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}}, {';', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x04, 0x08}},
      {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}}, {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}},
      {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}}, {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}},
      {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}}, {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}},
  };
  if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  if (c == ' ') return {};
  for (const entry& e : font)
    if (e.c == c) return e.rows;
  return {0x1F, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1F};
}

/// An RGB raster with clipped drawing; coordinates in pixels from the top-left, x right, y down.
class canvas {
 public:
  /// @pre width, height >= 1.
  canvas(int width, int height, rgb background = white) {
    require(width >= 1 && height >= 1, "a canvas needs at least one pixel, got ", width, " x ", height);
    image_.width = width;
    image_.height = height;
    image_.pixels.resize(static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3);
    fill_rect(0, 0, width - 1, height - 1, background);
  }

  [[nodiscard]] int width() const { return image_.width; }
  [[nodiscard]] int height() const { return image_.height; }
  [[nodiscard]] const rgb_image& image() const { return image_; }

  /// Sets one pixel; pixels outside the canvas are ignored.
  void set(int x, int y, rgb c) {
    if (x < 0 || y < 0 || x >= image_.width || y >= image_.height) return;
    const auto at =
        (static_cast<std::size_t>(y) * static_cast<std::size_t>(image_.width) + static_cast<std::size_t>(x)) * 3;
    image_.pixels[at] = c.r;
    image_.pixels[at + 1] = c.g;
    image_.pixels[at + 2] = c.b;
  }

  /// @pre (x, y) inside the canvas.
  [[nodiscard]] rgb at(int x, int y) const {
    const auto i =
        (static_cast<std::size_t>(y) * static_cast<std::size_t>(image_.width) + static_cast<std::size_t>(x)) * 3;
    return {image_.pixels[i], image_.pixels[i + 1], image_.pixels[i + 2]};
  }

  /// The rectangle with corners (x0, y0) and (x1, y1), both included.
  void fill_rect(int x0, int y0, int x1, int y1, rgb c) {
    for (int y = std::min(y0, y1); y <= std::max(y0, y1); ++y)
      for (int x = std::min(x0, x1); x <= std::max(x0, x1); ++x) set(x, y, c);
  }

  /// A segment `thickness` pixels wide, stamped every half pixel; non-finite ends draw nothing.
  void line(double x0, double y0, double x1, double y1, rgb c, int thickness = 1) {
    if (!std::isfinite(x0) || !std::isfinite(y0) || !std::isfinite(x1) || !std::isfinite(y1)) return;
    const double length = std::hypot(x1 - x0, y1 - y0);
    const int samples = static_cast<int>(std::min(1e5, std::ceil(length * 2.0))) + 1;
    const int low = -(thickness - 1) / 2, high = thickness / 2;
    for (int i = 0; i <= samples; ++i) {
      const double t = static_cast<double>(i) / samples;
      const int x = static_cast<int>(std::lround(x0 + t * (x1 - x0)));
      const int y = static_cast<int>(std::lround(y0 + t * (y1 - y0)));
      fill_rect(x + low, y + low, x + high, y + high, c);
    }
  }

  /// Every pixel whose centre is within `radius` of (cx, cy).
  void disc(double cx, double cy, double radius, rgb c) {
    if (!std::isfinite(cx) || !std::isfinite(cy)) return;
    for (int y = static_cast<int>(std::floor(cy - radius)); y <= static_cast<int>(std::ceil(cy + radius)); ++y)
      for (int x = static_cast<int>(std::floor(cx - radius)); x <= static_cast<int>(std::ceil(cx + radius)); ++x)
        if ((x - cx) * (x - cx) + (y - cy) * (y - cy) <= radius * radius) set(x, y, c);
  }

  /// The outline of a circle, one pixel wide.
  void circle(double cx, double cy, double radius, rgb c) {
    const int samples = std::max(16, static_cast<int>(std::ceil(2.0 * 3.141592653589793 * radius * 2.0)));
    for (int i = 0; i < samples; ++i) {
      const double angle = 2.0 * 3.141592653589793 * i / samples;
      set(static_cast<int>(std::lround(cx + radius * std::cos(angle))),
          static_cast<int>(std::lround(cy + radius * std::sin(angle))), c);
    }
  }

  /// Text with its top-left corner at (x, y); each glyph pixel is a scale x scale square, glyphs 6 apart.
  void text(int x, int y, std::string_view s, rgb c, int scale = 1) {
    for (const char ch : s) {
      const auto rows = glyph(ch);
      for (int row = 0; row < 7; ++row)
        for (int col = 0; col < 5; ++col)
          if (rows[static_cast<std::size_t>(row)] & (0x10 >> col))
            fill_rect(x + col * scale, y + row * scale, x + col * scale + scale - 1, y + row * scale + scale - 1, c);
      x += 6 * scale;
    }
  }

  /// Width in pixels of text(s, scale): 6 per glyph less the last gap. Example: text_width("AB", 2) == 22.
  [[nodiscard]] static int text_width(std::string_view s, int scale = 1) {
    return s.empty() ? 0 : (6 * static_cast<int>(s.size()) - 1) * scale;
  }

 private:
  rgb_image image_;
};

/// "Nice" tick values (1, 2 or 5 times a power of ten apart) covering [low, high] with about `target` steps.
/// Example: nice_ticks(0, 1, 5) == {0, 0.2, 0.4, 0.6, 0.8, 1}; nice_ticks(0.13, 0.87, 5) == {0, 0.2, ..., 1}
///   (step 0.74 / 5 = 0.148 rounds up to 0.2; the ends round outwards). An empty range [v, v] widens to
///   v -+ 0.5 (or -+ |v| / 10 when larger).
/// @pre low <= high, both finite; target >= 1.
inline std::vector<double> nice_ticks(double low, double high, int target = 5) {
  require(std::isfinite(low) && std::isfinite(high) && low <= high, "nice_ticks needs a finite range, got [", low, ", ",
          high, "]");
  require(target >= 1, "nice_ticks target must be at least 1, got ", target);
  if (high - low <= 0.0) {
    const double half = std::max(0.5, std::abs(low) / 10.0);
    low -= half;
    high += half;
  }
  const double raw = (high - low) / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double residual = raw / magnitude;
  const double step = (residual <= 1.0 + 1e-9   ? 1.0
                       : residual <= 2.0 + 1e-9 ? 2.0
                       : residual <= 5.0 + 1e-9 ? 5.0
                                                : 10.0) *
                      magnitude;
  const double first = std::floor(low / step + 1e-9), last = std::ceil(high / step - 1e-9);
  std::vector<double> ticks;
  for (double k = first; k <= last + 0.5; k += 1.0) ticks.push_back(std::abs(k) < 0.5 ? 0.0 : k * step);
  return ticks;
}

/// A tick value with as many decimals as the tick step needs. Example: tick_label(0.4, 0.2) == "0.4";
/// tick_label(15, 5) == "15"; tick_label(0.05, 0.05) == "0.05".
inline std::string tick_label(double value, double step) {
  const int decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(std::abs(step)) - 1e-9)), 0, 6);
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  std::string s = buffer;
  if (s.find_first_not_of("-0.") == std::string::npos && s.front() == '-') s.erase(0, 1);  // no "-0"
  return s;
}

/// Grid lines, tick marks and tick labels of a chart whose plot area is [left, right] x [top, bottom] pixels; px and
/// py map a data value to its pixel column / row (line_chart's render and compare's band chart share this).
template <class ToColumn, class ToRow>
void draw_grid(canvas& c, const std::vector<double>& x_ticks, const std::vector<double>& y_ticks, int left, int right,
               int top, int bottom, const ToColumn& px, const ToRow& py) {
  const double x_step = x_ticks.size() > 1 ? x_ticks[1] - x_ticks[0] : 1.0;
  const double y_step = y_ticks.size() > 1 ? y_ticks[1] - y_ticks[0] : 1.0;
  for (const double x : x_ticks) {
    const int at = static_cast<int>(std::lround(px(x)));
    c.line(at, top, at, bottom, grid_grey);
    c.line(at, bottom, at, bottom + 5, axis_grey);
    const std::string label = tick_label(x, x_step);
    c.text(at - canvas::text_width(label) / 2, bottom + 9, label, black);
  }
  for (const double y : y_ticks) {
    const int at = static_cast<int>(std::lround(py(y)));
    c.line(left, at, right, at, grid_grey);
    c.line(left - 5, at, left, at, axis_grey);
    const std::string label = tick_label(y, y_step);
    c.text(left - 9 - canvas::text_width(label), at - 3, label, black);
  }
}

/// One line of a line chart; non-finite y values break the line.
struct series {
  std::string name;
  rgb colour;
  std::vector<double> x, y;
};

/// A line chart: title on top, x label under the axis, y label above it, legend on the right.
struct line_chart {
  std::string title, x_label, y_label;
  int width = 900, height = 520;
  std::vector<series> lines;
};

/// Renders `chart`: each series as a 2-pixel line (with a dot per point when it has at most 40), on axes with
/// nice ticks spanning every finite point.
/// @pre every series has as many x as y values; width >= 400, height >= 200.
inline rgb_image render(const line_chart& chart) {
  require(chart.width >= 400 && chart.height >= 200, "line chart of ", chart.width, " x ", chart.height,
          " is below 400 x 200");
  double x_low = std::numeric_limits<double>::infinity(), x_high = -x_low, y_low = x_low, y_high = -x_low;
  for (const series& s : chart.lines) {
    require(s.x.size() == s.y.size(), "series '", s.name, "' has ", s.x.size(), " x and ", s.y.size(), " y values");
    for (std::size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) {
        x_low = std::min(x_low, s.x[i]);
        x_high = std::max(x_high, s.x[i]);
        y_low = std::min(y_low, s.y[i]);
        y_high = std::max(y_high, s.y[i]);
      }
  }
  if (!std::isfinite(x_low)) x_low = x_high = y_low = y_high = 0.0;  // nothing to draw: empty axes
  x_low = std::min(x_low, 0.0);
  const std::vector<double> x_ticks = nice_ticks(x_low, x_high, 8), y_ticks = nice_ticks(y_low, y_high, 6);

  canvas c(chart.width, chart.height);
  int legend_width = 0;
  for (const series& s : chart.lines) legend_width = std::max(legend_width, canvas::text_width(s.name, 2));
  const int left = 80, right = chart.width - (legend_width + 60), top = 50, bottom = chart.height - 60;
  const double x0 = x_ticks.front(), x1 = x_ticks.back(), y0 = y_ticks.front(), y1 = y_ticks.back();
  const auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (right - left); };
  const auto py = [&](double y) { return bottom - (y - y0) / (y1 - y0) * (bottom - top); };

  draw_grid(c, x_ticks, y_ticks, left, right, top, bottom, px, py);
  c.line(left, top, left, bottom, axis_grey);
  c.line(left, bottom, right, bottom, axis_grey);
  c.text((chart.width - canvas::text_width(chart.title, 2)) / 2, 12, chart.title, black, 2);
  c.text((left + right - canvas::text_width(chart.x_label)) / 2, bottom + 26, chart.x_label, black);
  c.text(8, top - 18, chart.y_label, black);

  for (const series& s : chart.lines) {
    for (std::size_t i = 1; i < s.x.size(); ++i)
      c.line(px(s.x[i - 1]), py(s.y[i - 1]), px(s.x[i]), py(s.y[i]), s.colour, 2);
    if (s.x.size() <= 40)
      for (std::size_t i = 0; i < s.x.size(); ++i)
        if (std::isfinite(s.y[i])) c.disc(px(s.x[i]), py(s.y[i]), 3.0, s.colour);
  }
  for (std::size_t i = 0; i < chart.lines.size(); ++i) {
    const int y = top + 10 + static_cast<int>(i) * 24;
    c.line(right + 15, y + 7, right + 35, y + 7, chart.lines[i].colour, 3);
    c.text(right + 42, y, chart.lines[i].name, black, 2);
  }
  return c.image();
}

/// A point of a scatter panel, in data coordinates.
struct scatter_point {
  double x = 0, y = 0;
  rgb colour;
};

/// One panel: a title, the points (dots) and circles drawn under them (centre, colour; radius per grid).
struct scatter_panel {
  std::string title;
  std::vector<scatter_point> points;
  std::vector<scatter_point> circles;
};

/// Square panels side by side (`columns` per row) over [-extent, extent]^2, under a title and a caption.
struct scatter_grid {
  std::string title, caption;
  int columns = 3;
  int panel_size = 300;
  double extent = 3.0;
  double circle_radius = 0.5;  ///< data units
  std::vector<scatter_panel> panels;
};

/// Renders `grid`: per panel a frame, light axes through 0, the circles, then the points (2.5-pixel dots);
/// points outside the extent are clipped.
/// @pre columns >= 1, panel_size >= 100, extent > 0, at least one panel.
inline rgb_image render(const scatter_grid& grid) {
  require(grid.columns >= 1 && grid.panel_size >= 100 && grid.extent > 0.0 && !grid.panels.empty(),
          "scatter grid needs columns >= 1, panel_size >= 100, extent > 0 and a panel");
  const int count = static_cast<int>(grid.panels.size());
  const int columns = std::min(grid.columns, count), rows = (count + columns - 1) / columns;
  const int gap = 20, title_height = 44, panel_title = 22, caption_height = 26;
  const int width = gap + columns * (grid.panel_size + gap);
  const int height = title_height + rows * (panel_title + grid.panel_size + gap) + caption_height;
  canvas c(width, height);
  c.text((width - canvas::text_width(grid.title, 2)) / 2, 12, grid.title, black, 2);
  const double scale = grid.panel_size / (2.0 * grid.extent);
  for (int i = 0; i < count; ++i) {
    const scatter_panel& panel = grid.panels[static_cast<std::size_t>(i)];
    const int left = gap + (i % columns) * (grid.panel_size + gap);
    const int top = title_height + (i / columns) * (panel_title + grid.panel_size + gap) + panel_title;
    const int right = left + grid.panel_size, bottom = top + grid.panel_size;
    const auto px = [&](double x) { return left + (x + grid.extent) * scale; };
    const auto py = [&](double y) { return bottom - (y + grid.extent) * scale; };
    c.text(left + (grid.panel_size - canvas::text_width(panel.title, 2)) / 2, top - panel_title + 2, panel.title, black,
           2);
    c.line(px(0.0), top, px(0.0), bottom, grid_grey);
    c.line(left, py(0.0), right, py(0.0), grid_grey);
    for (const scatter_point& circle : panel.circles) {
      c.circle(px(circle.x), py(circle.y), grid.circle_radius * scale, circle.colour);
      c.circle(px(circle.x), py(circle.y), grid.circle_radius * scale + 1.0, circle.colour);
    }
    for (const scatter_point& p : panel.points)
      if (std::abs(p.x) < grid.extent && std::abs(p.y) < grid.extent) c.disc(px(p.x), py(p.y), 2.5, p.colour);
    c.line(left, top, right, top, axis_grey);
    c.line(left, bottom, right, bottom, axis_grey);
    c.line(left, top, left, bottom, axis_grey);
    c.line(right, top, right, bottom, axis_grey);
  }
  c.text(gap, height - caption_height + 8, grid.caption, black);
  return c.image();
}

}  // namespace branchgrpo::cli
