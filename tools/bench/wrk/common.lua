-- common.lua: shared helpers for the wrk scripts of tools/bench/http.sh (loaded with dofile).
-- Every thread gets a small integer id (set from setup() in the main Lua state), so that
-- RUN .. "-" .. tid .. "-" .. counter is a key no other request of any run has used.
local M = {}

local next_tid = 0
local threads = {}

-- setup() runs once per thread in the main state: hand each thread its id.
function M.setup(thread)
  next_tid = next_tid + 1
  thread:set("tid", next_tid)
  table.insert(threads, thread)
end

-- VERIFY=<substring>: response() checks every body for it and done() reports the counts.
-- Only used in the short check runs: a response() callback makes wrk parse every body.
function M.install_verify(expect)
  ok_count, bad_count, first_bad = 0, 0, nil
  response = function(status, headers, body)
    if body and string.find(body, expect, 1, true) then
      ok_count = ok_count + 1
    else
      bad_count = bad_count + 1
      if not first_bad then first_bad = tostring(status) .. " " .. tostring(body) end
    end
  end
end

function M.done(summary, latency, requests)
  local ok, bad, sample = 0, 0, nil
  for _, t in ipairs(threads) do
    ok = ok + (t:get("ok_count") or 0)
    bad = bad + (t:get("bad_count") or 0)
    sample = sample or t:get("first_bad")
  end
  if os.getenv("VERIFY") then
    io.write(string.format("VERIFY ok=%d bad=%d\n", ok, bad))
    if sample then io.write("VERIFY first_bad=" .. sample .. "\n") end
  end
end

-- Standard base64 (RFC 4648, with padding), for etcd's JSON gateway (keys are bytes).
local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
function M.b64(s)
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = string.byte(s, i, i + 2)
    local n = a * 65536 + (b or 0) * 256 + (c or 0)
    local c1 = math.floor(n / 262144) % 64
    local c2 = math.floor(n / 4096) % 64
    local c3 = math.floor(n / 64) % 64
    local c4 = n % 64
    out[#out + 1] = B64:sub(c1 + 1, c1 + 1) .. B64:sub(c2 + 1, c2 + 1)
      .. (b and B64:sub(c3 + 1, c3 + 1) or "=") .. (c and B64:sub(c4 + 1, c4 + 1) or "=")
  end
  return table.concat(out)
end

return M
