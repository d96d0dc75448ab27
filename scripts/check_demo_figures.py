#!/usr/bin/env python3
"""Keeps README.md's demo table tied to the demo run it quotes (docs/demo/report.md).

Usage: scripts/check_demo_figures.py [--readme README.md] [--report docs/demo/report.md]
       scripts/check_demo_figures.py --rerun [--tool build/bin/branchgrpo] [--out DIR]
       scripts/check_demo_figures.py --self-test

Default (ctest `docs_demo_figures`, labels docs and reliability; reads two files, no run): every figure of the
README's table "What the demo reported" -- held-out reward before and after, gain, evaluations, trained edges,
seconds per iteration and the ratio to dance -- must be the same text as the stored report's, row by row; so
must the run's shape in the sentence above the table (iterations x prompts per method, held-out noises per
prompt) and its wall time, which the note at the top of the report states with the command, the commit and the
machine. The command must be the one scripts/demo.sh runs. A difference fails with the row and column named.

--self-test (ctest `docs_demo_figures_self_test`): changes each figure of the README's table, and the wall time,
in memory, one at a time, and expects the static check to fail naming it.

--rerun: the static check, then runs the report's command (`TOOL demo --out DIR`, DIR a new temporary folder
unless --out is given; ~7 minutes on 2 busy cores) with OMP_NUM_THREADS set to the note's thread count (LibTorch's
reductions, so the rewards' last digits, depend on it) and compares every reward column of its report.md (reward before,
reward after, gain, alignment after) and its evaluations and edges with the stored report's, exactly; and, when
docs/demo/demo.csv is stored, every column of the new demo.csv but the seconds. Times are not compared: they are
the machine's.
"""
import argparse
import csv
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_TABLE = '| method | held-out reward before -> after |'
REPORT_TABLE = '| method | reward before | reward after | gain |'
# README column -> report column, for the figures split out of the README's cells.
README_TO_REPORT = [('held-out reward before', 'reward before'), ('held-out reward after', 'reward after'),
                    ('gain', 'gain'), ('evaluations / iter', 'evaluations / iter'),
                    ('trained edges / iter', 'trained edges / iter'), ('s / iter', 's / iter'),
                    ('vs dance', 'vs dance')]
# What a rerun must reproduce exactly (everything in report.md but the times).
RERUN_COLUMNS = ['reward before', 'reward after', 'gain', 'alignment after', 'evaluations / iter', 'edges / iter',
                 'trained edges / iter']
CSV_TIME_COLUMNS = {'seconds', 'cumulative_seconds'}


class Mismatch(Exception):
    pass


def read(path):
    try:
        with open(path, encoding='utf-8') as f:
            return f.read()
    except OSError as error:
        raise Mismatch('{}: cannot read: {}'.format(path, error.strerror))


def cells(line):
    return [cell.strip() for cell in line.strip().strip('|').split('|')]


def table(text, header_start, path):
    """The markdown table whose header line starts with header_start: (columns, [(method, {column: cell})])."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(header_start)]
    if len(starts) != 1:
        raise Mismatch('{}: {} table starting "{}"'.format(path, 'no' if not starts else 'more than one',
                                                           header_start))
    columns = cells(lines[starts[0]])
    rows = []
    for number, line in enumerate(lines[starts[0] + 2:], starts[0] + 3):
        if not line.startswith('|'):
            break
        values = cells(line)
        if len(values) != len(columns):
            raise Mismatch('{}:{}: {} cells, the header has {}'.format(path, number, len(values), len(columns)))
        rows.append((values[0], dict(zip(columns, values))))
    if not rows:
        raise Mismatch('{}: the table starting "{}" has no rows'.format(path, header_start))
    return columns, rows


def readme_rows(text, path):
    columns, rows = table(text, README_TABLE, path)
    out = []
    for method, row in rows:
        cell = row[columns[1]]
        match = re.fullmatch(r'(\S+) -> (\S+) \((\S+)\)', cell)
        if not match:
            raise Mismatch('{}: demo table, row {}, column "{}": "{}" is not "BEFORE -> AFTER (GAIN)"'.format(
                path, method, columns[1], cell))
        figures = dict(zip(['held-out reward before', 'held-out reward after', 'gain'], match.groups()))
        for column in columns[2:]:
            figures[column] = row[column]
        out.append((method, figures))
    return out


def compare_rows(left, right, pairs, where, left_name, right_name):
    """Fails on the first row or figure that differs between two [(method, {column: text})] lists."""
    left_methods, right_methods = [m for m, _ in left], [m for m, _ in right]
    if left_methods != right_methods:
        raise Mismatch('{}: methods {} but {} has {}'.format(where, ', '.join(left_methods), right_name,
                                                             ', '.join(right_methods)))
    errors = []
    for (method, a), (_, b) in zip(left, right):
        for left_column, right_column in pairs:
            if left_column not in a:
                raise Mismatch('{}: no column "{}"'.format(left_name, left_column))
            if right_column not in b:
                raise Mismatch('{}: no column "{}"'.format(right_name, right_column))
            if a[left_column] != b[right_column]:
                errors.append('{}, row {}, column "{}": {} but {} says {}'.format(
                    where, method, left_column, a[left_column], right_name, b[right_column]))
    if errors:
        raise Mismatch('\n'.join(errors))


def one(pattern, text, what, path):
    found = re.findall(pattern, text)
    if len(found) != 1:
        raise Mismatch('{}: {} {} ({})'.format(path, 'no' if not found else 'more than one', what, pattern))
    return found[0]


def readme_intro(text, path):
    """The paragraph above the README's demo table, as written."""
    return one(r'What the demo reported[^\n]*(?:\n(?!\|)[^\n]*)*', text, 'sentence "What the demo reported"', path)


def check_static(readme, report, readme_text=None):
    readme_text = read(readme) if readme_text is None else readme_text
    report_text = read(report)
    _, report_table = table(report_text, REPORT_TABLE, report)
    compare_rows(readme_rows(readme_text, readme), report_table, README_TO_REPORT, readme + ': demo table', readme, report)

    # The sentence above the README's table: the run's shape and its wall time.
    intro = ' '.join(readme_intro(readme_text, readme).split())
    shape = re.search(r'(\d+) iterations x (\d+) prompts per method', intro)
    noises = re.search(r'held-out reward on (\d+) unseen noises per prompt', intro)
    wall = re.search(r'(\d+ min \d+ s)', intro)
    if not shape or not noises or not wall:
        raise Mismatch('{}: the sentence "What the demo reported ..." must give "N iterations x M prompts per '
                       'method", "held-out reward on K unseen noises per prompt" and the wall time "X min Y s"'
                       .format(readme))
    report_shape = one(r'Each method: (\d+) iterations x (\d+) prompts', report_text, 'line "Each method:"', report)
    report_noises = one(r'every prompt x (\d+) keyed noises', report_text, '"every prompt x K keyed noises"', report)
    report_wall = one(r'[Ww]all time (\d+ min \d+ s)', report_text, 'note "wall time X min Y s"', report)
    for what, mine, theirs in [('iterations x prompts', 'x'.join(shape.groups()), 'x'.join(report_shape)),
                               ('held-out noises per prompt', noises.group(1), report_noises),
                               ('wall time', wall.group(1), report_wall)]:
        if mine != theirs:
            raise Mismatch('{}: sentence above the demo table, {}: {} but {} says {}'.format(
                readme, what, mine, report, theirs))

    # The report's note names the command that made it: the one scripts/demo.sh (the README's main job) runs.
    command = one(r'Made by `([^`]+)`', report_text, 'note "Made by `COMMAND`"', report)
    demo_sh = os.path.join(ROOT, 'scripts', 'demo.sh')
    if command not in [line.strip() for line in read(demo_sh).splitlines()]:
        raise Mismatch('{}: made by `{}`, which {} does not run'.format(report, command, demo_sh))
    return command, report_table


def read_csv(path):
    with open(path, newline='', encoding='utf-8') as f:
        return list(csv.DictReader(f))


def rerun(report, command, stored_table, tool, out):
    words = shlex.split(command)
    if len(words) < 2 or words[1] != 'demo' or '--out' not in words:
        raise Mismatch('{}: cannot rerun `{}` (not `TOOL demo ... --out DIR`)'.format(report, command))
    words[0] = tool
    words[words.index('--out') + 1] = out
    # LibTorch's reductions, hence the rewards' last digits, depend on its thread count: run on the stored run's.
    threads = one(r'on (\d+) threads', read(report), 'note "on N threads"', report)
    environment = dict(os.environ, OMP_NUM_THREADS=threads)
    print('running: OMP_NUM_THREADS={} {}'.format(threads, ' '.join(shlex.quote(w) for w in words)), flush=True)
    if subprocess.call(words, cwd=ROOT, env=environment) != 0:
        raise Mismatch('the rerun `{}` failed'.format(' '.join(words)))
    new_report = os.path.join(out, 'report.md')
    _, new_table = table(read(new_report), REPORT_TABLE, new_report)
    pairs = [(column, column) for column in RERUN_COLUMNS]
    compare_rows(stored_table, new_table, pairs, report, report, new_report)
    stored_csv = os.path.join(os.path.dirname(report), 'demo.csv')
    if os.path.exists(stored_csv):
        old, new = read_csv(stored_csv), read_csv(os.path.join(out, 'demo.csv'))
        if len(old) != len(new):
            raise Mismatch('{}: {} rows but the rerun wrote {}'.format(stored_csv, len(old), len(new)))
        for number, (a, b) in enumerate(zip(old, new), 2):
            for column in a:
                if column not in CSV_TIME_COLUMNS and a[column] != b.get(column):
                    raise Mismatch('{}:{} ({} iteration {}), column {}: {} but the rerun wrote {}'.format(
                        stored_csv, number, a['method'], a['iteration'], column, a[column], b.get(column)))
        print('{}: every column but the seconds matches the rerun ({} rows)'.format(stored_csv, len(old)))
    print('{}: every reward, evaluation and edge figure matches the rerun ({})'.format(report, new_report))


def bump(figure):
    """The figure with its last digit changed (0.6594 -> 0.6595, 406 -> 407, 9 -> 0)."""
    digits = [i for i, c in enumerate(figure) if c.isdigit()]
    if not digits:
        raise Mismatch('"{}" has no digit to change'.format(figure))
    i = digits[-1]
    return figure[:i] + str((int(figure[i]) + 1) % 10) + figure[i + 1:]


def self_test(readme, report):
    """Changes each figure of the README's table (and the wall time) in turn, in memory, and expects the check
    to fail naming that row and column: a check that cannot fail would keep nothing tied."""
    text = read(readme)
    check_static(readme, report, text)
    columns, rows = table(text, README_TABLE, readme)
    lines = text.split('\n')
    cases = 0
    for method, row in rows:
        (number,) = [i for i, line in enumerate(lines) if line.startswith('| {} |'.format(method))]
        for figure_column, _ in README_TO_REPORT:
            values = cells(lines[number])
            if figure_column in columns:
                index = columns.index(figure_column)
                values[index] = bump(values[index])
            else:
                parts = list(re.fullmatch(r'(\S+) -> (\S+) \((\S+)\)', values[1]).groups())
                which = ['held-out reward before', 'held-out reward after', 'gain'].index(figure_column)
                parts[which] = bump(parts[which])
                values[1] = '{} -> {} ({})'.format(*parts)
            changed = list(lines)
            changed[number] = '| ' + ' | '.join(values) + ' |'
            expected = 'row {}, column "{}"'.format(method, figure_column)
            try:
                check_static(readme, report, '\n'.join(changed))
            except Mismatch as error:
                if expected not in str(error):
                    raise Mismatch('self-test: changing {} failed with another message: {}'.format(expected, error))
            else:
                raise Mismatch('self-test: changing {} in {} was not caught'.format(expected, readme))
            cases += 1
    intro = readme_intro(text, readme)
    wall = re.search(r'\d+ min \d+ s', intro)
    if not wall:
        raise Mismatch('self-test: {}: write the wall time "X min Y s" on one line'.format(readme))
    try:
        check_static(readme, report, text.replace(intro, intro.replace(wall.group(0), bump(wall.group(0)), 1), 1))
    except Mismatch as error:
        if 'wall time' not in str(error):
            raise Mismatch('self-test: changing the wall time failed with another message: {}'.format(error))
    else:
        raise Mismatch('self-test: changing the wall time in {} was not caught'.format(readme))
    print('self-test: each of the {} figures of the demo table and the wall time, changed, fails the check'.format(
        cases))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--readme', default=os.path.join(ROOT, 'README.md'))
    parser.add_argument('--report', default=os.path.join(ROOT, 'docs', 'demo', 'report.md'))
    parser.add_argument('--rerun', action='store_true', help='also rerun the demo and compare its figures')
    parser.add_argument('--self-test', action='store_true',
                        help='change each README figure in memory and expect the check to name it')
    parser.add_argument('--tool', default=os.path.join(ROOT, 'build', 'bin', 'branchgrpo'))
    parser.add_argument('--out', help='--rerun: where the demo writes (default: a new temporary folder)')
    args = parser.parse_args()
    try:
        if args.self_test:
            self_test(args.readme, args.report)
            return
        command, stored_table = check_static(args.readme, args.report)
        print('{}: the demo table and its sentence match {}'.format(args.readme, args.report))
        if args.rerun:
            rerun(args.report, command, stored_table, args.tool, args.out or tempfile.mkdtemp(prefix='demo-rerun-'))
    except Mismatch as error:
        sys.exit(str(error))


if __name__ == '__main__':
    main()
