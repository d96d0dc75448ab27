// branchgrpo::app alone, from the installed package (LibTorch, toml++, TurboJPEG): every app header compiles from
// the install, and the shapes data set renders an image without a model file; fails unless the image has the
// documented shape and its corner pixel is background (0.84 +- 0.06 in every channel).
#include <branchgrpo/app/rewards.hpp>
#include <branchgrpo/app/shapes.hpp>
#include <branchgrpo/app/training_run.hpp>

#include <cmath>
#include <iostream>

int main() {
  const branchgrpo::shapes_target target = branchgrpo::parse_shapes_prompt("A Blue triangle");
  const torch::Tensor image = branchgrpo::shapes_render(branchgrpo::shapes_draw(0, 5, 4));  // a green square
  const double corner = image[0][0][0].item<double>();
  std::cout << "shapes: " << branchgrpo::shapes_prompts()[4] << " -> " << image.sizes() << ", corner " << corner
            << '\n';
  const bool sized = image.dim() == 3 && image.size(0) == 3 && image.size(1) == branchgrpo::shapes_image_size &&
                     image.size(2) == branchgrpo::shapes_image_size;
  return sized && std::abs(corner - 0.84) <= 0.061 && target.colour == 2 && target.shape == 2 ? 0 : 1;
}
