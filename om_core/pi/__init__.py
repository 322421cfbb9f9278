"""Pi's side (pi-sessions.md §1, §2, §7; SPEC §12): its session files, tree, branch entries, cut point and token estimate, what a live Pi asks om, and the files om writes for Pi."""
