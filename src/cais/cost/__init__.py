"""What the switch extensions cost in silicon and energy (issue 57): a CACTI driver
(:mod:`.cacti`) and the merge unit's arrays (:mod:`.merge_unit`)."""
