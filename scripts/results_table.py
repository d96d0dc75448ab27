#!/usr/bin/env python3
"""Markdown tables of a `branchgrpo compare` summary.json, as docs/results.md shows them.

Usage: scripts/results_table.py out/compare/summary.json

Prints three tables (rewards, time, equal-time comparisons), each cell `mean [low, high]` with the 95 % Student-t
interval over the seeds that `compare` computed, and one line with the setup (seeds, iterations, t quantile,
budgets). Only reads the file; every number is compare's.
"""
import json
import sys

# The named methods first in this order, then any other label (a `--methods` variant) in the file's order.
ORDER = ['dance', 'branch', 'branch-widpru', 'branch-deppru', 'branch-mix']


def cell(method, key, digits=4, sign=False):
    mean = method[key + '_mean'] if key + '_mean' in method else method[key]
    low, high = method[key + '_ci_low'], method[key + '_ci_high']
    if mean is None or low is None or high is None:
        return 'n/a'
    form = ('{:+.%df}' if sign else '{:.%df}') % digits
    return '{} [{}, {}]'.format(form.format(mean), form.format(low), form.format(high))


def ratio(method):
    return '{:.2f} [{:.2f}, {:.2f}]'.format(method['time_ratio_vs_dance'], method['time_ratio_ci_low'],
                                            method['time_ratio_ci_high'])


def table(header, rows):
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' + '---:|' * (len(header) - 1)]
    lines += ['| ' + ' | '.join(row) + ' |' for row in rows]
    return '\n'.join(lines)


def main(path):
    summary = json.load(open(path))
    if 'dance' not in summary:
        sys.exit('{}: no method dance (every comparison is to it)'.format(path))
    names = [name for name in ORDER if name in summary] + [name for name in summary if name not in ORDER]
    methods = [(name, summary[name]) for name in names]
    dance = summary['dance']
    print('{} seeds from {}, {} iterations, held-out evaluation every {}; t_(0.975, {}) = {:.3f}; budget: dance\'s '
          'mean time for {} iterations, {:.2f} s wall, {:.2f} s CPU'.format(
              dance['seeds'], dance['first_seed'], dance['iterations'], dance['eval_every'], dance['seeds'] - 1,
              dance['t_quantile'], dance['budget_iterations'], dance['budget_seconds'], dance['cpu_budget_seconds']))
    print()
    print(table(['method', 'held-out before', 'after', 'gain', 'gain - dance\'s (paired)'],
                [[name, '{:.4f}'.format(m['base_reward_mean']), cell(m, 'final_reward'),
                  cell(m, 'gain', sign=True), cell(m, 'gain_vs_dance', sign=True)] for name, m in methods]))
    print()
    print(table(['method', 's / iter', 'time vs dance', 'CPU s / iter', 'CPU time vs dance',
                 'trained edges / iter', 'evaluations / iter'],
                [[name, cell(m, 'seconds_per_iter', 3), ratio(m), cell(m, 'cpu_seconds_per_iter', 3),
                  cell(m, 'cpu_time_ratio_vs_dance', 2), '{:.1f}'.format(m['edges_trained']),
                  '{:.1f}'.format(m['evaluations'])] for name, m in methods]))
    print()
    print(table(['method', 'held-out reward at the budget', '- dance at equal time', 'at the CPU budget',
                 '- dance at equal CPU time'],
                [[name, cell(m, 'reward_at_budget'), cell(m, 'vs_dance_at_equal_time', sign=True),
                  cell(m, 'reward_at_cpu_budget'), cell(m, 'vs_dance_at_equal_cpu_time', sign=True)]
                 for name, m in methods]))


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit('usage: scripts/results_table.py SUMMARY.json')
    main(sys.argv[1])
