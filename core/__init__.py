"""What every app stands on (issue 25): shared mechanisms below the apps."""
