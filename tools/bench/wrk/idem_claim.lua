-- idem_claim.lua: POST /v1/claims on idemd's JSON API.
-- env: IDEM_TOKEN (tenant bearer token), RUN (unique prefix of this run),
--      MODE=fresh (every request a never-used Idempotency-Key -> "acquired", one Raft write)
--      MODE=replay (cycle over NKEYS keys RUN-rep-0.. that http.sh claimed and completed
--                   beforehand -> the stored response is replayed, no write)
--      MODE=livez (GET /livez: the gateway answers at once, no claim and no cluster work;
--                  cpu.sh's floor of what an HTTP request costs the node that answers it)
--      FP (64 hex fingerprint; the replay keys were claimed with the same one), VERIFY,
--      DELAY_MS (optional: each connection waits this long after every answer, to pace the
--                load), RATE and THREADS (optional: an open loop of RATE requests/s over
--                wrk's THREADS threads: each thread sends on a fixed schedule, one request
--                every THREADS/RATE s on whichever connection is free, whatever the answers'
--                latency; a thread that fell behind sends at once until it caught up;
--                tools/bench/cpu.sh).
local C = dofile(os.getenv("BENCH_WRK_DIR") .. "/common.lua")
local token = os.getenv("IDEM_TOKEN")
local run = os.getenv("RUN")
local mode = os.getenv("MODE") or "fresh"
local nkeys = tonumber(os.getenv("NKEYS") or "16")
local body = '{"fingerprint": "' .. os.getenv("FP") .. '"}'
local counter = 0

setup = C.setup
done = C.done

-- response() must exist when the script is loaded for wrk to hand it the bodies.
if os.getenv("VERIFY") then C.install_verify(os.getenv("VERIFY")) end

local delay_ms = tonumber(os.getenv("DELAY_MS") or "0")
local rate = tonumber(os.getenv("RATE") or "0")
if rate > 0 then
  local ffi = require("ffi")
  ffi.cdef[[
    typedef struct { long tv_sec; long tv_nsec; } idem_timespec;
    int clock_gettime(int clk, idem_timespec *tp);
  ]]
  local ts = ffi.new("idem_timespec")
  local function now_ms()
    ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
    return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
  end
  local period = tonumber(os.getenv("THREADS") or "1") * 1000.0 / rate -- ms per send slot
  local next_at = nil
  -- wrk asks before each request but a connection's first: the slot this one takes.
  function delay()
    local now = now_ms()
    next_at = (next_at or now) + period
    local d = next_at - now
    return d > 0 and d or 0
  end
elseif delay_ms > 0 then
  function delay() return delay_ms end
end

function request()
  if mode == "livez" then
    return wrk.format("GET", "/livez")
  end
  counter = counter + 1
  local key
  if mode == "replay" then
    key = run .. "-rep-" .. ((counter + tid) % nkeys)
  else
    key = run .. "-" .. tid .. "-" .. counter
  end
  return wrk.format("POST", "/v1/claims", {
    ["Authorization"] = "Bearer " .. token,
    ["Idempotency-Key"] = key,
    ["Content-Type"] = "application/json",
  }, body)
end
