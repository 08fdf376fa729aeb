set -x
export PATH=/work/venv/bin:$PATH
cd /work/gemma-pol
date
microspec train dynaspec --model gemma-3-270m --features feat --out dynaspec --positions 30000 --threads 2
date
microspec train specvocab --model gemma-3-270m --features feat --out specvocab --positions 20000 --threads 2
date
microspec train coral --model gemma-3-270m --features feat --out coral --positions 30000 --threads 2
date
