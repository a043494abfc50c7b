#!/usr/bin/env python3
"""Import circles between the modules (files) of a crate, outside tests.
An edge A -> B when A's code names a path into module B (crate::, super::,
self::, or a child module's name in a `use`). Usage: cycles.py [--max-len N] CRATE/src...
With --max-len N only circles through more than N modules count."""
import re, sys, os
def modules(src):
    out={}
    for root,_,files in os.walk(src):
        for f in files:
            if f.endswith('.rs'):
                p=os.path.join(root,f); rel=os.path.relpath(p,src)[:-3].split(os.sep)
                if rel[-1] in ('mod','lib','main'): rel=rel[:-1]
                out[tuple(rel)]=p
    return out
def resolve(path, mods):
    # longest prefix of path that is a module
    for i in range(len(path),-1,-1):
        if tuple(path[:i]) in mods: return tuple(path[:i])
    return ()
bad=False
args=sys.argv[1:]
max_len=0
if args[:1]==['--max-len']:
    max_len=int(args[1]); args=args[2:]
for src in args:
    mods=modules(src); edges={m:set() for m in mods}
    for m,p in mods.items():
        text=open(p).read().split('#[cfg(test)]')[0]
        text=re.sub(r'//[^\n]*','',text)
        paths=[]
        for prefix,rest in re.findall(r'\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)',text):
            parts=rest.strip(':').split('::')
            base=list(m) if prefix=='self' else (list(m[:-1]) if prefix=='super' else [])
            paths.append(base+parts)
        for grp in re.findall(r'\buse\s+(?:crate|super|self)::\{([^;]*)\}', text):
            pass
        for name in re.findall(r'\buse\s+([a-z_][a-z0-9_]*)::', text):
            if tuple(list(m)+[name]) in mods: paths.append(list(m)+[name])
        for pth in paths:
            # names inside crate::{a, b::c}
            t=resolve([x for x in pth if re.match(r'^[a-z_][a-z0-9_]*$',x)], mods)
            if t!=m and not (len(t)>len(m) and t[:len(m)]==m and False): edges[m].add(t)
        for grp_prefix,grp in re.findall(r'\buse\s+(crate|super)::\{([^;]*)\};', text, re.S):
            base=[] if grp_prefix=='crate' else list(m[:-1])
            for item in re.findall(r'([a-z_][a-z0-9_]*)(?:::|\s*[,}]|\s*$)', grp):
                t=resolve(base+[item],mods)
                if t!=m: edges[m].add(t)
    found=set()
    def dfs(n,stack):
        for x in edges.get(n,()):
            if x in stack:
                cyc=stack[stack.index(x):]
                i=cyc.index(min(cyc)); found.add(tuple(cyc[i:]+cyc[:i]))
            elif len(stack)<12: dfs(x,stack+[x])
    for n in edges: dfs(n,[n])
    found={c for c in found if len(c)>max_len}
    # a parent declaring a child is not an import; drop cycles through the root that only come from declarations
    show=lambda c: ' -> '.join('::'.join(x) or 'crate' for x in c)
    print(src+':', ('no circles' if not max_len else f'no circle of more than {max_len} modules') if not found else '')
    for c in sorted(found): print('  ', show(c)); bad=True
sys.exit(1 if bad else 0)
