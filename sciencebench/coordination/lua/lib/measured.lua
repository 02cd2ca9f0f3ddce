-- measured(record): the measured seconds a trial record (JSON) stores (`measured_sec`,
-- computed when it was written), as `coordination.history.stored_seconds` reads them.
local function measured(record)
  local ok, r = pcall(cjson.decode, record)
  if not ok or type(r) ~= 'table' then
    return nil
  end
  local seconds = r['measured_sec']
  if type(seconds) ~= 'number' or seconds < 0 then
    return nil
  end
  return seconds
end
