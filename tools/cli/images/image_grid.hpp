#pragma once
// A grid of small images for the tool's PNGs (`train` leaf grids, `sample`, `demo` before/after): cells enlarged
// by pixel repetition, a title, one label per row on the left and one per column on top (a '\n' in a column
// label starts a second line). Torch-free: cells are rgb_image (png.hpp).
#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "cli/images/plot.hpp"
#include "cli/images/png.hpp"

namespace branchgrpo::cli {

struct image_grid {
  std::string title;
  int columns = 1;
  int scale = 4;                           ///< each cell pixel becomes scale x scale
  std::vector<std::string> row_labels;     ///< empty, or one per row
  std::vector<std::string> column_labels;  ///< empty, or one per column
  std::vector<rgb_image> cells;            ///< row-major; all the same size
};

/// Renders `grid`: 4-pixel gaps between cells, labels in the 5 x 7 font.
/// Example: 2 cells of 16 x 16, columns 2, scale 4, no labels -> cells of 64 x 64 side by side under the title.
/// @pre columns >= 1, scale >= 1, at least one cell, every cell of the first cell's size, labels empty or
///      matching the row / column counts (else invalid_input).
inline rgb_image render(const image_grid& grid) {
  require(grid.columns >= 1 && grid.scale >= 1 && !grid.cells.empty(),
          "image grid needs columns >= 1, scale >= 1 and a cell");
  const int cell_w = grid.cells.front().width * grid.scale, cell_h = grid.cells.front().height * grid.scale;
  for (const rgb_image& cell : grid.cells)
    require(cell.width == grid.cells.front().width && cell.height == grid.cells.front().height,
            "image grid cells differ in size: ", cell.width, " x ", cell.height, " and ", grid.cells.front().width,
            " x ", grid.cells.front().height);
  const int count = static_cast<int>(grid.cells.size());
  const int columns = std::min(grid.columns, count), rows = (count + columns - 1) / columns;
  require(grid.row_labels.empty() || static_cast<int>(grid.row_labels.size()) == rows, "image grid has ",
          grid.row_labels.size(), " row labels for ", rows, " rows");
  require(grid.column_labels.empty() || static_cast<int>(grid.column_labels.size()) == columns, "image grid has ",
          grid.column_labels.size(), " column labels for ", columns, " columns");
  const auto lines = [](std::string_view label) {
    std::vector<std::string> out(1);
    for (const char ch : label) {
      if (ch == '\n')
        out.emplace_back();
      else
        out.back() += ch;
    }
    return out;
  };
  const int gap = 4, margin = 10, title_height = grid.title.empty() ? 0 : 30;
  int label_width = 0;
  for (const std::string& label : grid.row_labels) label_width = std::max(label_width, canvas::text_width(label) + 8);
  int header_lines = 0;
  for (const std::string& label : grid.column_labels)
    header_lines = std::max(header_lines, static_cast<int>(lines(label).size()));
  const int header_height = header_lines * 10 + (header_lines > 0 ? 4 : 0);
  const int width = std::max(margin * 2 + label_width + columns * (cell_w + gap) - gap,
                             margin * 2 + canvas::text_width(grid.title, 2));
  const int height = margin * 2 + title_height + header_height + rows * (cell_h + gap) - gap;
  canvas c(width, height);
  if (!grid.title.empty()) c.text(margin, margin, grid.title, black, 2);
  const int left = margin + label_width, top = margin + title_height + header_height;
  for (int col = 0; col < static_cast<int>(grid.column_labels.size()); ++col) {
    const auto parts = lines(grid.column_labels[static_cast<std::size_t>(col)]);
    for (std::size_t k = 0; k < parts.size(); ++k)
      c.text(left + col * (cell_w + gap) + (cell_w - canvas::text_width(parts[k])) / 2,
             margin + title_height + static_cast<int>(k) * 10, parts[k], black);
  }
  for (int row = 0; row < static_cast<int>(grid.row_labels.size()); ++row)
    c.text(margin, top + row * (cell_h + gap) + (cell_h - 7) / 2, grid.row_labels[static_cast<std::size_t>(row)],
           black);
  for (int i = 0; i < count; ++i) {
    const rgb_image& cell = grid.cells[static_cast<std::size_t>(i)];
    const int x0 = left + (i % columns) * (cell_w + gap), y0 = top + (i / columns) * (cell_h + gap);
    for (int y = 0; y < cell.height; ++y)
      for (int x = 0; x < cell.width; ++x) {
        const std::size_t at =
            (static_cast<std::size_t>(y) * static_cast<std::size_t>(cell.width) + static_cast<std::size_t>(x)) * 3;
        const rgb colour{cell.pixels[at], cell.pixels[at + 1], cell.pixels[at + 2]};
        c.fill_rect(x0 + x * grid.scale, y0 + y * grid.scale, x0 + (x + 1) * grid.scale - 1,
                    y0 + (y + 1) * grid.scale - 1, colour);
      }
  }
  return c.image();
}

}  // namespace branchgrpo::cli
