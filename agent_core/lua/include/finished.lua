-- finished(status): whether a run status is final.
local function finished(st)
  return st == 'completed' or st == 'failed' or st == 'cancelled'
end
