#!/bin/bash
# usage: ab_train.sh WORKTREE RUN_DIR SEED
cd $1
OMP_NUM_THREADS=1 PYTHONPATH=$1 .venv/bin/python train_agent.py --warm-start jigsaw --warm-start-s ${WS:-240} --dagger-rounds ${DR:-2} --dagger-s ${DS:-120} \
  --bc-width-power 1 --bc-threads 1 --policy slots --wide-share 0.5 --wide-gpus 32 --n-steps 64 --learning-rate 1e-5 \
  --trace philly:$JIGSAW_DATA/philly/philly.csv --gpus 64 --max-jobs 80 --load 1.0 --holdout 0.2 --val 0.1 --n-envs 2 \
  --timesteps 128 --eval-freq 100000 --eval-episodes 1 --seed $3 --no-progress --no-tensorboard --run-dir $2
