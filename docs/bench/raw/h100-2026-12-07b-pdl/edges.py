# The listings kernels-plain.txt and kernels-pdl.txt compared by edge: for each (kind of kernel, kind of the next),
# the edges, their gaps summed and the next kernels' time summed (us a replay). Run here: python3 edges.py > edges.txt
import re, sys, collections
def load(path, graph):
    rows=[]; on=False
    for line in open(path):
        if line.startswith(f"{graph} graph B="): on=True; continue
        if on and re.match(r"^\w+ graph B=", line): break
        m = re.match(r"\s*(\d+)\s+([\d.]+) gap\s+([\d.]+) grid \S+ \S+ \S+ block \S+ \S+ \S+ (.*)", line)
        if on and m:
            name=m.group(4)
            kind = 'nvjet' if 'nvjet' in name else 'cudnn' if ('xmma' in name or 'cudnn' in name) else 'triton_ind' if name.startswith('triton_') else 'ours' if name.split()[0].endswith('_kernel') and 'at::' not in name and 'void' not in name else 'aten'
            rows.append((int(m.group(1)), float(m.group(2)), float(m.group(3)), kind, name[:60]))
    return rows
for graph in ["talker","codes","decode"]:
    print("==", graph)
    res={}
    for f in ["plain","pdl"]:
        rows=load(f"kernels-{f}.txt", graph)
        d=collections.defaultdict(lambda:[0,0.0,0.0])
        for i in range(1,len(rows)):
            k=(rows[i-1][3], rows[i][3]); d[k][0]+=1; d[k][1]+=rows[i][2]; d[k][2]+=rows[i][1]
        res[f]=d
    for k in sorted(set(res["plain"])|set(res["pdl"])):
        a=res["plain"].get(k,[0,0,0]); b=res["pdl"].get(k,[0,0,0])
        print(f"{k[0]:>10} -> {k[1]:<10} n={a[0]:4d}/{b[0]:4d} gap {a[1]:7.1f} -> {b[1]:7.1f}   next-kernel time {a[2]:8.1f} -> {b[2]:8.1f}")
