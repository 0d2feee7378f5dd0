#!/usr/bin/env bash
# The images' tag: a hash of exactly what `docker build` reads, so that it names what goes into them.
#   deploy/image-tag.sh        # run from the repository root, as the Makefile does
# That is the Dockerfile, .dockerignore and the paths .dockerignore admits (its `!` lines, read here so
# the list is stated once), as they are in the working tree: committed or not, tracked or untracked
# (files git ignores are left out; under those paths they are caches .dockerignore drops too). It is
# their git tree hash, written through an index of its own: the same content gives the same tag on any
# commit, and a file outside the images (deploy/schedules.yaml) does not change it. The tree is stored,
# so `git ls-tree -r TAG` lists what the images were built from while git keeps the object.
set -euo pipefail

mapfile -t admitted < <(sed -n 's/^!//p' .dockerignore)
paths=(Dockerfile .dockerignore)
for path in "${admitted[@]}"; do
  # A path the tree lacks would fail `git add`; the build's COPY names it, and fails, if it matters.
  [[ -e "$path" ]] && paths+=("$path")
done

index_dir="$(mktemp -d)"
trap 'rm -rf "$index_dir"' EXIT
export GIT_INDEX_FILE="$index_dir/index"
git add --all -- "${paths[@]}"
git write-tree | cut -c1-12
