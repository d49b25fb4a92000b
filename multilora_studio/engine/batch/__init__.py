"""What runs in a step, as plain Python without torch: the requests' sequences, the KV block
table and the scheduler's plan."""
