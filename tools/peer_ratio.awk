# mxtune's decode (the first profile's graph step) and prefill against llama.cpp's tg128 and pp2048.
/\| *tg128 *\|/ { split($0, c, "|"); split(c[9], v, "±"); tg = v[1] + 0; tgd = v[2] + 0 }
/\| *pp2048 *\|/ { split($0, c, "|"); split(c[9], v, "±"); pp = v[1] + 0 }
!d && /decode step, graphs on/ { if (match($0, /-> [0-9.]+ tok\/s/)) d = substr($0, RSTART + 3, RLENGTH - 9) + 0 }
/^prefill of 2048/ { if (match($0, /-> [0-9.]+ tok\/s/)) p = substr($0, RSTART + 3, RLENGTH - 9) + 0 }
END {
  if (!(tg > 0 && d > 0)) { print "ratio: a figure is missing (llama.cpp tg128 " tg ", mxtune decode " d ")"; exit 1 }
  printf "mxtune / llama.cpp, decode: %.1f / %.2f tok/s = %.2fx (%.2f-%.2fx over llama.cpp's +-%.2f)\n", d, tg, d / tg, d / (tg + tgd), d / (tg - tgd), tgd
  if (pp > 0 && p > 0) printf "mxtune / llama.cpp, prefill pp2048: %.0f / %.2f tok/s = %.2fx\n", p, pp, p / pp
}
