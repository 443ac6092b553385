"""What a run will cost before it starts: the estimates, each job's requests, the printed plan and `tacl plan`."""
