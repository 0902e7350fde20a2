# Markdown table of the study (scripts/scaling): modeled communication per step and wire bytes sent per rank,
# one row per method, one column per N, at bandwidth g (awk -v g=10 -f table.awk threads_mlp.csv).
BEGIN { FS = "," }
NR > 1 && $4 == g && $3 !~ /^flexible/ {
  key = $3 SUBSEP $2; t[key] = $6 * 1e3; w[key] = $7 / 1024; how[key] = $11
  if (!($3 in seen)) { seen[$3] = 1; order[++nm] = $3 }
  if (!($2 in seenn)) { seenn[$2] = 1; ns[++nn] = $2 }
}
END {
  printf "| method |"; for (i = 1; i <= nn; i++) printf " N = %s |", ns[i]; print ""
  printf "|---|"; for (i = 1; i <= nn; i++) printf "---|"; print ""
  for (j = 1; j <= nm; j++) {
    printf "| %s |", order[j]
    for (i = 1; i <= nn; i++) {
      k = order[j] SUBSEP ns[i]
      if (k in t) printf " %.3g ms, %.0f KB%s |", t[k], w[k], how[k] == "model" ? " (model)" : ""
      else printf " - |"
    }
    print ""
  }
}
