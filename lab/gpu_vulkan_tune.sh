#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# lab/gpu_vulkan_tune.sh: the Vulkan tuning sweep next to CUDA on a GPU machine, with the
# correctness proof of the configuration it picks. It is the [vulkan_tune] section of
# lab/gpu_check.sh run alone; that script's header says what the build machine and the GPU
# machine need and which variables configure it, and the section says what it runs.
#
#   lab/gpu_vulkan_tune.sh prepare          # build machine: build-vkperf, packed into build-gpu-bundle/
#   lab/gpu_vulkan_tune.sh run [--dry-run]  # GPU machine, with build-gpu-bundle/ (and the Vulkan
#                                                # loader's .deb folder when the system has no loader)
#   lab/gpu_vulkan_tune.sh all              # both, on a machine that can build and has the GPU
exec env SECTIONS=vulkan_tune "$(dirname "$0")/gpu_check.sh" "$@"
