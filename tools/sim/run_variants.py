# Runs the policy variants of hwm.py over traces; prints one markdown row per (variant, trace, pass).
# Usage: python3 run_variants.py VARIANT_GROUP TRACE...   (groups: see VARIANTS)
import os, sys
from multiprocessing import Pool
import hwm

VARIANTS = {
    'slack': [(f'plain slack={sl} victim={v}', dict(slack=sl, victim=v))
              for sl in (0, 0.01, 0.02, 4, 8, 16) for v in ('hi', 'lo', 'near')],
    'aware': [(f'{nm} slack={sl}', dict(slack=sl, victim='hi', **kw))
              for nm, kw in (('small-aware', dict(small_aware=True)), ('large-aware', dict(large_aware=True)),
                             ('both-aware', dict(small_aware=True, large_aware=True)))
              for sl in (0, 0.01, 0.02, 8)],
    'runs': [(f'small-aware+large-runs slack={sl} victim={v}', dict(slack=sl, victim=v, small_aware=True, large_runs=True))
             for sl in (0, 0.01, 0.02, 4, 8, 16) for v in ('hi', 'near')],
    'best': [(f'small-aware+large-runs slack=max(16,1%) victim={v}',
              dict(slack=(16, 0.01), victim=v, small_aware=True, large_runs=True)) for v in ('hi', 'near')],
    'layout': [(f'{nm} slack={sl} victim={v}', dict(slack=sl, victim=v, small_aware=True, large_aware=True, **kw))
               for nm, kw in (('both-aware+sep', dict(sep=True)), ('both-aware+per-stream', dict(per_stream=True)),
                              ('both-aware+sep+per-stream', dict(sep=True, per_stream=True)))
               for sl in (0, 0.02) for v in ('hi', 'near')],
}


def one(args):
    name, kw, path = args
    ev = hwm.load(path)
    rows = []
    for r in hwm.run(ev, **kw):
        n = r['events'] / 1000
        rows.append(f"| {name} | {os.path.basename(path).split('.')[0]} | {r['pass_']} | {r['fp']:.3f} | "
                    f"{r['creates'] / n:.1f} | {r['moves'] / n:.1f} | {(r['creates'] + r['moves']) / n:.1f} | "
                    f"{r['runs'] / n:.1f} |")
    return rows


if __name__ == '__main__':
    group = sys.argv[1]
    exec_vars = VARIANTS[group]
    jobs = [(name, kw, p) for name, kw in exec_vars for p in sys.argv[2:]]
    print('| variant | trace | pass | footprint | creates/1k | moves/1k | map ops/1k (chunks) | map ops/1k (runs) |')
    print('|---|---|---|---|---|---|---|---|')
    with Pool(int(os.environ.get('JOBS', '2'))) as pool:
        for rows in pool.imap(one, jobs):
            for row in rows:
                print(row, flush=True)
