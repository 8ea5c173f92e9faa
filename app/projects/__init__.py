"""Projects, jobs, attempts and leasing."""
