"""The limiter: the asyncio bulkhead that enforces the admission core's decisions."""
