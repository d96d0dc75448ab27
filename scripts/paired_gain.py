#!/usr/bin/env python3
"""Each method's held-out gain minus a reference method's, paired per seed, from a `branchgrpo compare` runs.csv.

Usage: scripts/paired_gain.py out/compare/runs.csv [REFERENCE]      (REFERENCE: a method's label, default branch)

compare's own tables pair every method with dance; an ablation asks what one change does to its method, so this
pairs each label with REFERENCE instead: per seed, (last held-out reward - first) of the method minus the same of
REFERENCE, then the mean and its 95 % Student-t interval over the seeds (mean -+ t_(0.975, N-1) s / sqrt N), as
compare computes its intervals. Prints one markdown row per method. Only reads the file.
"""
import csv
import math
import statistics
import sys

# t_(0.975, n) for n = 1 .. 30 degrees of freedom.
T_975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def gains(rows):
    first, last = {}, {}
    for row in rows:
        key, iteration, reward = (row['method'], row['seed']), int(row['iteration']), float(row['heldout_reward'])
        if iteration == 0:
            first[key] = reward
        if key not in last or iteration >= last[key][0]:
            last[key] = (iteration, reward)
    return {key: last[key][1] - first[key] for key in first}


def main(path, reference):
    rows = list(csv.DictReader(open(path)))
    gain = gains(rows)
    methods = list(dict.fromkeys(row['method'] for row in rows))
    if reference not in methods:
        sys.exit('{}: no method {} (methods: {})'.format(path, reference, ', '.join(methods)))
    seeds = sorted({seed for (method, seed) in gain if method == reference}, key=int)
    if len(seeds) < 2 or len(seeds) > len(T_975) + 1:
        sys.exit('{}: {} seeds; paired intervals need 2 to {}'.format(path, len(seeds), len(T_975) + 1))
    print('| method | gain - {} (paired, {} seeds) |'.format(reference, len(seeds)))
    print('|---|---:|')
    for method in methods:
        differences = [gain[(method, seed)] - gain[(reference, seed)] for seed in seeds]
        mean = sum(differences) / len(differences)
        half = T_975[len(differences) - 2] * statistics.stdev(differences) / math.sqrt(len(differences))
        print('| {} | {:+.4f} [{:+.4f}, {:+.4f}] |'.format(method, mean, mean - half, mean + half))


if __name__ == '__main__':
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else 'branch')
