G=/work/main/target/release/gleaner
W="$G bench workload openloop --rate 200 --duration-ms 10000 --json"
for cfg in default price-0.005 price-0.0025; do
  c=""; [ $cfg != default ] && c="--config /tmp/s31/$cfg.toml"
  echo "== $cfg"
  $G compare --runs 5 --policies naive,gleaner $c -- $W
done
